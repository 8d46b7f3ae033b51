-- Runs several of the crate's scripts in one call: a group's members (see
-- src/conn/composite.rs, which puts `local function script_of(sha)` above this text: it
-- returns the crate's script of that SHA1 as `function(KEYS, ARGV) <its text> end`; the
-- parameters shadow the globals the text reads, so each runs as if called alone).
-- KEYS     every member's keys, member after member
-- ARGV     per member, in the same order: its script's SHA1, its number of keys, its number of
--          arguments, then its arguments
-- Reply: one entry per member, in order —
--        {1, reply} its script's reply;
--        {0}        its script replied nil or false (a nil would end a Lua array: tagged);
--        {2, error} its script failed, or replied an error: the error reply's text.
-- Each member runs under `pcall`: one member's error leaves the others' runs as they are, as
-- separate calls would (a script's writes before its error stay, as for a single call).
-- Each script's function made once per call, when a member first needs it.
local scripts = setmetatable({}, {__index = function(made, sha)
    local script = script_of(sha)
    made[sha] = script
    return script
end})
local replies = {}
local key, arg = 0, 1
while arg <= #ARGV do
    local script = scripts[ARGV[arg]]
    local nkeys, nargs = tonumber(ARGV[arg + 1]), tonumber(ARGV[arg + 2])
    local keys, args = {}, {}
    for i = 1, nkeys do
        keys[i] = KEYS[key + i]
    end
    for i = 1, nargs do
        args[i] = ARGV[arg + 2 + i]
    end
    key, arg = key + nkeys, arg + 3 + nargs
    local ok, reply = pcall(script, keys, args)
    if not ok then
        -- `redis.call` raises its error reply (a table on some Redis versions, its text on
        -- others: an upper-case code first); Lua's own errors ("user_script:3: ...") Redis
        -- reports under ERR.
        if type(reply) == 'table' then
            reply = reply.err
        end
        reply = tostring(reply)
        if not string.find(reply, '^%u+ ') then
            reply = 'ERR ' .. reply
        end
        replies[#replies + 1] = {2, reply}
    elseif type(reply) == 'table' and reply.err then
        replies[#replies + 1] = {2, reply.err}
    elseif reply == nil or reply == false then
        replies[#replies + 1] = {0}
    else
        replies[#replies + 1] = {1, reply}
    end
end
return replies
