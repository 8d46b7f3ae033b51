//! The composite script: several of a group's scripts in one call (on a server that is not a
//! cluster: see `Groups::calls`).
//!
//! A group's members each cost the server a call of their own (and fred a command of its
//! own); they can share one: the composite holds the text of every script of
//! the crate that can travel in a group, each as a Lua function keyed by its SHA1, and runs
//! the members it is given one after the other (see `lua/conn/composite.lua` for the call's
//! layout and reply). Each member's keys, effects, publishes and reply are those of its own
//! script run alone; only the number of calls changes.

use std::collections::HashSet;

use fred::error::{Error as FredError, ErrorKind};
use fred::types::scripts::Script;
use fred::types::Value;

use super::LuaScript;

/// The most members one composite call carries: a call blocks the server while it runs, so
/// it stays short however large the group.
pub(crate) const MAX_MEMBERS: usize = 64;

/// The composite of a set of scripts.
pub(crate) struct Composite {
    /// The composite's own text and SHA1.
    pub(crate) script: Script,
    /// The SHA1s of the scripts it can run.
    shas: HashSet<String>,
}

impl Composite {
    /// The composite of `scripts` (their order does not matter; a duplicate counts once).
    pub(crate) fn new(scripts: &[&LuaScript]) -> Composite {
        let mut shas = HashSet::new();
        // A chain of tests, not a table of every function: a table constructor would make a
        // closure of each script on every call, which cost the server more than the calls
        // the composite saves when groups are small.
        let mut text = String::from("local function script_of(sha)\n");
        for script in scripts {
            let sha = script.sha1().to_string();
            let Some(lua) = script.lua() else { continue };
            if shas.insert(sha.clone()) {
                text.push_str(&format!(
                    "if sha == '{sha}' then return function(KEYS, ARGV)\n{lua}\nend end\n"
                ));
            }
        }
        text.push_str("end\n");
        text.push_str(include_str!(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/lua/conn/composite.lua"
        )));
        Composite {
            script: Script::from_lua(text),
            shas,
        }
    }

    /// Whether the `EVALSHA` arguments `command` run a script the composite holds.
    pub(crate) fn holds(&self, command: &[Value]) -> bool {
        command
            .first()
            .and_then(Value::as_str)
            .is_some_and(|sha| self.shas.contains(sha.as_ref()))
    }

    /// Whether the `EVALSHA` arguments `a` and `b` name a key in common. Two such scripts never
    /// share a call: Redis checks a call's keys once, before it runs, so a key an earlier
    /// member deleted would meet a later member inside the call — on a node whose slot is
    /// migrating, that is an error (`Script attempted to access a non local key`) where the
    /// later script sent alone would have been redirected (ASK) before it ran.
    pub(crate) fn share_a_key(a: &[Value], b: &[Value]) -> bool {
        let (a, _) = split(a);
        let (b, _) = split(b);
        a.iter().any(|key| b.contains(key))
    }

    /// The composite's `EVALSHA` arguments for `commands` (each an `EVALSHA`'s arguments of a
    /// script it holds: sha, numkeys, keys..., args...).
    pub(crate) fn command<'a>(
        &self,
        commands: impl Iterator<Item = &'a [Value]> + Clone,
    ) -> Vec<Value> {
        let mut args = vec![Value::from(self.script.sha1().clone()), Value::from(0)];
        let mut nkeys = 0;
        for command in commands.clone() {
            let (keys, _) = split(command);
            nkeys += keys.len();
            args.extend(keys.iter().cloned());
        }
        args[1] = Value::from(nkeys as i64);
        for command in commands {
            let (keys, rest) = split(command);
            args.push(command[0].clone());
            args.push(Value::from(keys.len() as i64));
            args.push(Value::from(rest.len() as i64));
            args.extend(rest.iter().cloned());
        }
        args
    }
}

/// An `EVALSHA`'s arguments (sha, numkeys, keys..., args...) as its keys and its arguments.
fn split(command: &[Value]) -> (&[Value], &[Value]) {
    let nkeys = command
        .get(1)
        .and_then(Value::as_i64)
        .map_or(0, |n| n.max(0) as usize)
        .min(command.len().saturating_sub(2));
    (&command[2..2 + nkeys], &command[2 + nkeys..])
}

/// Each of `members` members' outcome from the composite's `reply`: the reply, or the error,
/// its script's own `EVALSHA` would have given.
pub(crate) fn split_reply(reply: Value, members: usize) -> Vec<Result<Value, FredError>> {
    let malformed = || {
        Err(FredError::new(
            ErrorKind::Protocol,
            "malformed reply from the composite script",
        ))
    };
    let Value::Array(entries) = reply else {
        return (0..members).map(|_| malformed()).collect();
    };
    let mut outcomes: Vec<_> = entries
        .into_iter()
        .map(|entry| {
            let Value::Array(parts) = entry else {
                return malformed();
            };
            let mut parts = parts.into_iter();
            match (parts.next().and_then(|tag| tag.as_i64()), parts.next()) {
                (Some(0), None) => Ok(Value::Null),
                (Some(1), Some(value)) => Ok(value),
                (Some(2), Some(message)) => {
                    Err(error_reply(message.as_str().as_deref().unwrap_or_default()))
                }
                _ => malformed(),
            }
        })
        .collect();
    // Run, but not answered: as a reply lost (the script ran, its reply is unknown).
    outcomes.resize_with(members, malformed);
    outcomes.truncate(members);
    outcomes
}

/// The error fred makes of the error reply `text` to a single command: its kind from the
/// reply's code (the first word), as fred 10 sorts them, so callers read a member's error as
/// they read a script's own.
fn error_reply(text: &str) -> FredError {
    let mut words = text.split_whitespace();
    let kind = match words.next().unwrap_or_default() {
        "" => ErrorKind::Unknown,
        "ERR" if text.contains("instance has cluster support disabled") => ErrorKind::Config,
        "WRONGTYPE" => ErrorKind::InvalidArgument,
        "NOAUTH" | "WRONGPASS" => ErrorKind::Auth,
        "MOVED" | "ASK" | "CLUSTERDOWN" => ErrorKind::Cluster,
        "Invalid" => match words.next().unwrap_or_default() {
            "argument(s)" | "Argument" => ErrorKind::InvalidArgument,
            "command" | "Command" => ErrorKind::InvalidCommand,
            _ => ErrorKind::Unknown,
        },
        _ => ErrorKind::Unknown,
    };
    let details = if text.is_empty() {
        "No response!".to_owned()
    } else {
        text.to_owned()
    };
    FredError::new(kind, details)
}

#[cfg(test)]
mod tests {
    use super::*;

    crate::conn::lua_script!(ACQUIRE, "lock/acquire.lua");
    crate::conn::lua_script!(RELEASE, "lock/release.lua");

    #[test]
    fn holds_only_its_scripts_once_each() {
        let composite = Composite::new(&[&ACQUIRE, &RELEASE, &ACQUIRE]);
        assert_eq!(composite.shas.len(), 2);
        let text = composite.script.lua().expect("text");
        assert_eq!(text.matches("return function(KEYS, ARGV)").count(), 2);
        assert!(composite.holds(&[Value::from(ACQUIRE.sha1().clone())]));
        assert!(!composite.holds(&[Value::from("0".repeat(40))]));
        assert!(!composite.holds(&[]));
    }

    #[test]
    fn the_command_lays_out_keys_then_each_members_arguments() {
        let composite = Composite::new(&[&ACQUIRE]);
        let sha = Value::from(ACQUIRE.sha1().clone());
        let one = vec![
            sha.clone(),
            Value::from(1),
            Value::from("a"),
            Value::from(30),
        ];
        let two = vec![sha.clone(), Value::from(1), Value::from("b")];
        let args = composite.command([one.as_slice(), two.as_slice()].into_iter());
        let expected = vec![
            Value::from(composite.script.sha1().clone()),
            Value::from(2),
            Value::from("a"),
            Value::from("b"),
            sha.clone(),
            Value::from(1),
            Value::from(1),
            Value::from(30),
            sha,
            Value::from(1),
            Value::from(0),
        ];
        assert_eq!(args, expected);
    }

    #[test]
    fn a_reply_splits_into_each_members_outcome() {
        let entry = |parts: Vec<Value>| Value::Array(parts);
        let reply = Value::Array(vec![
            entry(vec![Value::from(1), Value::from(5)]),
            entry(vec![Value::from(0)]),
            entry(vec![Value::from(2), Value::from("WRONGTYPE no")]),
        ]);
        let outcomes = split_reply(reply, 4);
        assert_eq!(outcomes[0].as_ref().ok(), Some(&Value::from(5)));
        assert_eq!(outcomes[1].as_ref().ok(), Some(&Value::Null));
        let wrong = outcomes[2].as_ref().expect_err("an error");
        assert_eq!(*wrong.kind(), ErrorKind::InvalidArgument);
        assert_eq!(wrong.details(), "WRONGTYPE no");
        assert_eq!(
            *outcomes[3].as_ref().expect_err("missing").kind(),
            ErrorKind::Protocol
        );
        assert!(split_reply(Value::from(1), 2).iter().all(Result::is_err));
    }

    #[test]
    fn error_replies_are_sorted_as_fred_sorts_them() {
        assert_eq!(*error_reply("ERR x").kind(), ErrorKind::Unknown);
        assert_eq!(*error_reply("NOAUTH x").kind(), ErrorKind::Auth);
        assert_eq!(*error_reply("MOVED 1 h:1").kind(), ErrorKind::Cluster);
        assert_eq!(
            *error_reply("Invalid command x").kind(),
            ErrorKind::InvalidCommand
        );
        assert_eq!(error_reply("").details(), "No response!");
    }
}
