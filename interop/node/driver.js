#!/usr/bin/env node
// Drives node-redisson (a third-party Node.js port of Redisson's RLock) for redbaton's interop
// tests (tests/interop.rs). The Rust test starts the redis-server, runs this script as a child
// process on loopback and drives redbaton on the same server and lock names.
//
// Usage:
//   node driver.js serve   --port P [--watchdog MS]
//   node driver.js counter --port P --name HEX --thread T --iterations N --prefix KEY
//
// `serve` reads one command a line on stdin and answers one line on stdout, tagged with the
// command's id; commands run concurrently, so a waiting lock does not block the others
// (<thread> is a decimal, or `-` for the port's default owner, see deviation 2):
//   <id> lock <thread> <nameHex> <leaseMs|-> <waitMs|->   -> <id> ok <acquired 0|1> <t>
//   <id> unlock <thread> <nameHex>                        -> <id> ok <t before the call>
//   <id> force <thread> <nameHex>                         -> <id> ok <deleted 0|1>
//   <id> ping                                             -> <id> ok
// Failures answer `<id> err <message>`. Lock names travel hex-encoded (UTF-8), so braces,
// spaces and any Unicode pass unchanged. A lease of `-` is the watchdog lease; a wait of `-`
// waits forever (`lock()`), a number is `tryLock(wait, lease)`. `<t>` is the wall clock in
// milliseconds (fractional), the same clock the Rust test reads. The first line printed is
// `ready <client uuid>`. End of stdin ends the process.
//
// `counter` increments `<prefix>:ready` once connected, then takes the lock N times and,
// inside it, checks `<prefix>:inside` (INCR must give 1, or `<prefix>:overlaps` is
// incremented), appends `N` to the list `<prefix>:order` and performs a read-modify-write
// increment of `<prefix>:count`; then it prints `done <N>`.
//
// node-redisson 1.0.4 differs from Redisson (redisson/redisson, see docs/WIRE.md) in
// these ways; the driver works around each so the suite tests what Redisson does:
//
// 1. prefixName: Redisson keeps a name containing `{` anywhere as it is
//    (`redisson_lock__channel:a{b}c`); the port keeps it only when the name *starts* with `{`
//    and wraps every other name in braces (`redisson_lock__channel:{a{b}c}`), so for a name
//    like `a{b}c` its waiters listen on, and its unlocks publish to, a channel Redisson never
//    uses, and the unlock latch key differs too. Worked around below by replacing the static
//    `RedissonBaseLock.prefixName` with Redisson's rule.
// 2. Owner field: Redisson's is `<client uuid>:<thread id as a decimal>`; the port's default
//    is `<client uuid>:<random uuid>` (one uuid per lock object). The driver passes a decimal
//    `clientId` to `getLock`, which gives Redisson's form, except for thread `-`, which keeps
//    the port's own (an operator must be able to inspect and break such a lock too).
// 3. Waiting: Redisson subscribes to the channel before it re-tries and keeps the subscription
//    while it waits; the port re-tries first and subscribes afterwards, once per wait, so a
//    release between its failed attempt and its SUBSCRIBE is missed and it sleeps for the
//    holder's remaining lease (up to 30 s with the watchdog); a woken waiter UNSUBSCRIBEs
//    before it re-tries (one more round trip per wake-up). Two waiters of one port client on
//    one channel also share one Redis subscription that the first woken one UNSUBSCRIBEs, and
//    the timer of a finished wait UNSUBSCRIBEs again later (after `quit()` that rejection is
//    unhandled and kills the process). The counter below therefore waits in slices of 100 ms
//    (`tryLock(100, lease)` until it succeeds), one waiter per process, and exits without
//    `quit()`; the wake-up tests release only once the port's waiter is subscribed (PUBSUB
//    NUMSUB, then a round trip through this driver) and use a fresh name per round.
// 4. Unlock latch: Redisson keeps the latch key for its retry window (about 16-20 s); the port
//    passes 10 ms, and its request id is a dashed uuid, not 32 hex digits. It only matters to a
//    retried unlock, which the port never does; nothing to work around.
// 5. No SPUBLISH/SSUBSCRIBE in a cluster (Redisson uses them on Redis 7+ clusters); the suite
//    runs on one server, where both use PUBLISH/SUBSCRIBE.
// 6. Packaging: the port requires ioredis without declaring it, and declares TypeScript as a
//    peer it does not need at run time: package.json lists ioredis, .npmrc skips peers.
// The same as Redisson: key = the name, acquire/unlock/renew/force-unlock scripts, unlock
// message "0" on `redisson_lock__channel:{name}`, lockWatchdogTimeout 30 s renewed every 10 s,
// a fixed lease remembered for the re-entrant unlock's PEXPIRE.
'use strict';

const { performance } = require('node:perf_hooks');
const readline = require('node:readline');
const { Redisson } = require('node-redisson');
const { RedissonBaseLock } = require('node-redisson/dist/locks/RedissonBaseLock');

// Deviation 1: Redisson's prefixName.
RedissonBaseLock.prefixName = (prefix, name) =>
  name.includes('{') ? `${prefix}:${name}` : `${prefix}:{${name}}`;

function now() {
  return performance.timeOrigin + performance.now();
}

function args(argv) {
  const out = {};
  for (let i = 0; i < argv.length; i += 2) {
    if (!argv[i].startsWith('--') || i + 1 >= argv.length) {
      throw new Error(`bad argument: ${argv[i]}`);
    }
    out[argv[i].slice(2)] = argv[i + 1];
  }
  return out;
}

function connect(opts) {
  const config = {
    redis: { options: { host: '127.0.0.1', port: Number(opts.port) } },
  };
  if (opts.watchdog) {
    config.lockWatchdogTimeout = BigInt(opts.watchdog);
  }
  return new Redisson(config);
}

const decodeName = (hex) => Buffer.from(hex, 'hex').toString('utf8');

async function serve(opts) {
  const redisson = connect(opts);
  const locks = new Map();
  // One lock object per (thread, name), as a Java thread keeps its RLock object. Thread `-`
  // is the port's own default owner (`<client uuid>:<lock uuid>`, deviation 2).
  const lockFor = (thread, nameHex) => {
    const key = `${thread}/${nameHex}`;
    if (!locks.has(key)) {
      if (thread === '-') {
        locks.set(key, redisson.getLock(decodeName(nameHex)));
      } else if (/^[0-9]+$/.test(thread)) {
        locks.set(key, redisson.getLock(decodeName(nameHex), thread));
      } else {
        throw new Error(`thread must be decimal or -: ${thread}`);
      }
    }
    return locks.get(key);
  };
  const handle = async (words) => {
    const [op, thread, nameHex, lease, wait] = words;
    switch (op) {
      case 'ping':
        return '';
      case 'lock': {
        const lock = lockFor(thread, nameHex);
        const leaseTime = lease === '-' ? true : Number(lease);
        let acquired = true;
        if (wait === '-') {
          await lock.lock(leaseTime);
        } else {
          acquired = await lock.tryLock(Number(wait), leaseTime);
        }
        return `${acquired ? 1 : 0} ${now()}`;
      }
      case 'unlock': {
        const lock = lockFor(thread, nameHex);
        const t = now();
        await lock.unlock();
        return `${t}`;
      }
      case 'force': {
        const deleted = await lockFor(thread, nameHex).forceUnlock();
        return deleted ? '1' : '0';
      }
      default:
        throw new Error(`unknown command: ${op}`);
    }
  };
  await redisson.redis.ping();
  process.stdout.write(`ready ${redisson.commandExecutor.id}\n`);
  const lines = readline.createInterface({ input: process.stdin });
  const inFlight = new Set();
  lines.on('line', (line) => {
    const [id, ...words] = line.trim().split(/\s+/);
    const done = handle(words).then(
      (reply) => process.stdout.write(`${id} ok${reply ? ' ' + reply : ''}\n`),
      (e) => process.stdout.write(`${id} err ${String(e.message).replace(/\s+/g, ' ')}\n`),
    );
    inFlight.add(done);
    done.finally(() => inFlight.delete(done));
  });
  // End of input: answer what is in flight (for at most 1 s: a waiting lock may never end).
  lines.on('close', () => {
    setTimeout(() => process.exit(0), 1000).unref();
    Promise.allSettled([...inFlight]).then(() => process.exit(0));
  });
}

async function counter(opts) {
  const redisson = connect(opts);
  const redis = redisson.redis;
  const lock = redisson.getLock(decodeName(opts.name), String(opts.thread));
  const n = Number(opts.iterations);
  const prefix = opts.prefix;
  await redis.incr(`${prefix}:ready`);
  for (let i = 0; i < n; i++) {
    // Deviation 3: wait in slices so a missed wake-up costs at most 100 ms.
    while (!(await lock.tryLock(100, true))) {
      // retry
    }
    if ((await redis.incr(`${prefix}:inside`)) !== 1) {
      await redis.incr(`${prefix}:overlaps`);
    }
    await redis.rpush(`${prefix}:order`, 'N');
    const value = Number((await redis.get(`${prefix}:count`)) ?? 0);
    await new Promise((resolve) => setTimeout(resolve, 1));
    await redis.set(`${prefix}:count`, value + 1);
    await redis.decr(`${prefix}:inside`);
    await lock.unlock();
  }
  // Deviation 3 again: the timer of a finished wait still fires later and UNSUBSCRIBEs; after
  // `quit()` that command rejects unhandled and crashes the process. Exit instead of quitting.
  process.stdout.write(`done ${n}\n`, () => process.exit(0));
}

const [mode, ...rest] = process.argv.slice(2);
const main = { serve, counter }[mode];
if (!main) {
  process.stderr.write('usage: driver.js serve|counter --port P ...\n');
  process.exit(64);
}
main(args(rest)).catch((e) => {
  process.stderr.write(`driver.js ${mode}: ${e.stack || e}\n`);
  process.exit(1);
});
