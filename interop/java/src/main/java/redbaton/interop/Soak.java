package redbaton.interop;

import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import java.util.Map;
import java.util.Random;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.redisson.api.RLock;
import org.redisson.api.RPermitExpirableSemaphore;
import org.redisson.api.RScript;
import org.redisson.api.RedissonClient;
import org.redisson.client.codec.StringCodec;

/**
 * {@code Driver soak}: a Java Redisson worker process of redbaton's mixed soak
 * (soak/, {@code --java}). It speaks the soak's file protocol in {@code --dir}, as the
 * soak's redbaton workers do: {@code ready-<id>} once connected, {@code progress-<id>} (valid
 * sections so far), and once {@code stop} appears, {@code history-<id>} (one section a line, the
 * format of soak/src/record.rs) and {@code summary-<id>} ({@code <counter>\t<value>} lines).
 *
 * <p>Each of {@code --tasks} threads picks a name ({@code --names hex:kind,...}; kinds
 * {@code lock}, {@code fair}, {@code fenced}, {@code write}, {@code leased}: a permit-expirable
 * semaphore of one permit) and a call, and inside the hold takes a fence (INCR), reads the guarded
 * counter, sleeps, and writes it back through the soak's compare-and-set script; sections are
 * timed with {@code System.nanoTime()}, which on Linux is {@code CLOCK_MONOTONIC}, the soak's
 * clock. Redisson tells a holder nothing when a lease is lost, so a section held with a fixed
 * lease counts as told lost from the end of that lease by this process's clock (less the drift
 * allowance redbaton takes); a process behind the fault proxy ({@code --proxied 1}), whose
 * renewals a stall can delay past the watchdog's lease, uses fixed leases only.
 */
final class Soak {
    private Soak() {}

    /** The soak's compare-and-set on the guarded counter (soak/src/record.rs). */
    private static final String CAS_SCRIPT = String.join("\n",
            "local newest = tonumber(redis.call('GET', KEYS[1]) or '0')",
            "local fence = tonumber(ARGV[1])",
            "if fence > newest then return {2, newest} end",
            "if fence < newest then",
            "    redis.call('HINCRBY', KEYS[2], 'rejected', 1)",
            "    return {0, newest}",
            "end",
            "redis.call('HSET', KEYS[2], 'value', ARGV[2], 'fence', ARGV[1])",
            "redis.call('HINCRBY', KEYS[2], 'accepted', 1)",
            "return {1, newest}");

    /** The fence and the counter's value, in one step (the redbaton workers pipeline them). */
    private static final String FENCE_SCRIPT = String.join("\n",
            "local fence = redis.call('INCR', KEYS[1])",
            "local value = redis.call('HGET', KEYS[2], 'value')",
            "return {fence, tonumber(value or '0')}");

    private static final int MAX_FIXED_LEASE_MS = 3000;

    /** A script's array reply: {@code MULTI} in Redisson 3, renamed {@code LIST} in 4. */
    private static final RScript.ReturnType ARRAY = Arrays.stream(RScript.ReturnType.values())
            .filter(t -> t.name().equals("LIST") || t.name().equals("MULTI"))
            .findFirst()
            .orElseThrow();

    private record Name(int index, String name, String kind) {}

    private static final class Counters {
        private final Map<String, Long> counts = new TreeMap<>();

        synchronized void add(String label) {
            counts.merge(label, 1L, Long::sum);
        }

        synchronized String text() {
            StringBuilder out = new StringBuilder();
            counts.forEach((k, v) -> out.append(k).append('\t').append(v).append('\n'));
            return out.toString();
        }
    }

    static void run(Map<String, String> opts) throws Exception {
        Path dir = Path.of(opts.get("dir"));
        int id = Integer.parseInt(opts.get("id"));
        int tasks = Integer.parseInt(opts.getOrDefault("tasks", "8"));
        long seed = Long.parseUnsignedLong(opts.getOrDefault("seed", "1"));
        boolean proxied = "1".equals(opts.get("proxied"));
        long graceMs = Long.parseLong(opts.getOrDefault("grace-secs", "60")) * 1000;
        List<Name> names = new ArrayList<>();
        for (String item : opts.get("names").split(",")) {
            String[] hexKind = item.split(":", 2);
            names.add(new Name(names.size(), Commands.decode(hexKind[0]), hexKind[1]));
        }
        RedissonClient locks = Driver.connect(opts);
        // The ledger's scripts must run at most once: a retried compare-and-set would count one
        // write twice. (The lock calls keep Redisson's retries, as a service has them.)
        Map<String, String> once = new java.util.HashMap<>(opts);
        once.put("retries", "0");
        RedissonClient ledger = Driver.connect(once);
        Counters counters = new Counters();
        List<String> history = java.util.Collections.synchronizedList(new ArrayList<>());
        AtomicLong valid = new AtomicLong();
        AtomicBoolean stop = new AtomicBoolean();
        Files.writeString(dir.resolve("ready-" + id), "");

        List<Thread> threads = new ArrayList<>();
        for (int t = 0; t < tasks; t++) {
            int task = t;
            Random rng = new Random(seed * 0x9E3779B97F4A7C15L + (id * 1000L + task) * 0xD6E8FEB86659FD93L);
            Worker worker = new Worker(locks, ledger, names, counters, history, valid, stop, rng, id, task, proxied);
            Thread thread = new Thread(worker::loop, "soak-" + task);
            thread.setDaemon(true);
            thread.start();
            threads.add(thread);
        }

        Path progress = dir.resolve("progress-" + id);
        Path stopFile = dir.resolve("stop");
        ProcessHandle parent = ProcessHandle.current().parent().orElse(null);
        while (!Files.exists(stopFile)) {
            if (parent != null && !parent.isAlive()) {
                Runtime.getRuntime().halt(3); // the soak is gone: nobody reads the results
            }
            writeAtomically(progress, Long.toString(valid.get()));
            Thread.sleep(200);
        }
        stop.set(true);
        long deadline = System.currentTimeMillis() + graceMs;
        long unfinished = 0;
        for (Thread thread : threads) {
            thread.join(Math.max(1, deadline - System.currentTimeMillis()));
            if (thread.isAlive()) {
                unfinished++;
            }
        }
        writeAtomically(progress, Long.toString(valid.get()));
        StringBuilder lines = new StringBuilder();
        synchronized (history) {
            history.forEach(line -> lines.append(line).append('\n'));
        }
        writeAtomically(dir.resolve("history-" + id), lines.toString());
        String summary = counters.text() + "tasks\t" + tasks + "\ntasks unfinished\t" + unfinished + "\n";
        writeAtomically(dir.resolve("summary-" + id), summary);
        // Threads that never finished may hold the clients: do not wait for a shutdown.
        Runtime.getRuntime().halt(0);
    }

    private static void writeAtomically(Path path, String text) throws IOException {
        Path tmp = path.resolveSibling(path.getFileName() + ".tmp");
        Files.writeString(tmp, text, StandardCharsets.UTF_8);
        Files.move(tmp, path, StandardCopyOption.REPLACE_EXISTING, StandardCopyOption.ATOMIC_MOVE);
    }

    /** One task: rounds of acquire, section, release until told to stop. */
    private static final class Worker {
        private final RedissonClient locks;
        private final RScript ledger;
        private final List<Name> names;
        private final Counters counters;
        private final List<String> history;
        private final AtomicLong valid;
        private final AtomicBoolean stop;
        private final Random rng;
        private final int id;
        private final int task;
        private final boolean proxied;

        Worker(RedissonClient locks, RedissonClient ledger, List<Name> names, Counters counters,
                List<String> history, AtomicLong valid, AtomicBoolean stop, Random rng, int id,
                int task, boolean proxied) {
            this.locks = locks;
            this.ledger = ledger.getScript(StringCodec.INSTANCE);
            this.names = names;
            this.counters = counters;
            this.history = history;
            this.valid = valid;
            this.stop = stop;
            this.rng = rng;
            this.id = id;
            this.task = task;
            this.proxied = proxied;
        }

        /** How to release a hold. */
        private interface Release {
            void release() throws Exception;
        }

        void loop() {
            while (!stop.get()) {
                Name name = names.get(rng.nextInt(names.size()));
                // Calls: lock() (watchdog), tryLock(wait) (watchdog), lock(lease), tryLock(wait, lease).
                int call = proxied ? 2 + rng.nextInt(2) : rng.nextInt(4);
                boolean leased = call >= 2;
                long wait = rng.nextInt(600);
                long lease = 200 + rng.nextInt(MAX_FIXED_LEASE_MS - 200 + 1);
                // A permit-expirable semaphore has no watchdog: its calls all take the fixed lease.
                boolean permit = name.kind().equals("leased");
                leased |= permit;
                String op = permit
                        ? new String[] {"acquire_with_lease", "try_acquire_with_lease"}[call % 2]
                        : new String[] {"lock", "try_lock_for", "lock_with_lease", "try_lock_with_lease"}[call];
                String label = "java:" + name.kind() + ":" + op;
                long called = System.nanoTime();
                Release release;
                try {
                    release = acquire(name, call, wait, lease);
                } catch (Exception e) {
                    counters.add("acquire error: java " + e.getClass().getSimpleName());
                    log(label + " failed: " + e);
                    sleep(5 + rng.nextInt(45));
                    continue;
                }
                if (release == null) {
                    counters.add("try missed");
                    continue;
                }
                counters.add("acquired: " + label);
                // The lease is known valid until its end by this clock, less the drift allowance.
                long validUntil = leased
                        ? called + TimeUnit.MILLISECONDS.toNanos(lease - (lease / 100 + 2))
                        : Long.MAX_VALUE;
                String line = section(name, label, called, validUntil);
                boolean gone = false;
                try {
                    release.release();
                } catch (IllegalMonitorStateException e) {
                    // A force-unlock may strike a hold whose acquire's reply was still on its
                    // way: Redisson reads nothing after it, so this is where the holder learns.
                    gone = true;
                    counters.add(System.nanoTime() > validUntil ? "unlock: lost" : "unlock: found the lock gone (not yet known lost)");
                } catch (Exception e) {
                    counters.add("unlock error: java " + e.getClass().getSimpleName());
                    log(label + " unlock failed: " + e);
                }
                // The owner field is not known here ("-"); then whether the release found the hold gone.
                history.add(line + " - " + (gone ? 1 : 0));
            }
        }

        /** Takes {@code name} by {@code call}; null when a try did not get it. */
        private Release acquire(Name name, int call, long wait, long lease) throws Exception {
            if (name.kind().equals("leased")) {
                RPermitExpirableSemaphore permits = locks.getPermitExpirableSemaphore(name.name());
                String permit = null;
                if (call % 2 == 0) {
                    // Redisson's acquire() waits on the channel alone, with no timer: a message
                    // lost to a cut connection hangs it for good (a run behind the proxy met it).
                    // A service must bound it, and so does this worker: 1 s tries until it gets one.
                    while (permit == null && !stop.get()) {
                        permit = permits.tryAcquire(1000, lease, TimeUnit.MILLISECONDS);
                    }
                } else {
                    permit = permits.tryAcquire(wait, lease, TimeUnit.MILLISECONDS);
                }
                String taken = permit;
                return taken == null ? null : () -> permits.release(taken);
            }
            RLock lock = switch (name.kind()) {
                case "lock" -> locks.getLock(name.name());
                case "fair" -> locks.getFairLock(name.name());
                case "fenced" -> locks.getFencedLock(name.name());
                case "write" -> locks.getReadWriteLock(name.name()).writeLock();
                default -> throw new IllegalArgumentException("unknown kind " + name.kind());
            };
            boolean acquired = switch (call) {
                case 0 -> {
                    lock.lock();
                    yield true;
                }
                case 1 -> lock.tryLock(wait, TimeUnit.MILLISECONDS);
                case 2 -> {
                    lock.lock(lease, TimeUnit.MILLISECONDS);
                    yield true;
                }
                default -> lock.tryLock(wait, lease, TimeUnit.MILLISECONDS);
            };
            return acquired ? lock::unlock : null;
        }

        /** The critical section, recorded in the soak's history format. */
        /** Runs a section under the hold; returns its history line but for the release's columns. */
        private String section(Name name, String label, long called, long validUntil) {
            long hold = pickHold();
            long start = System.nanoTime();
            List<String> keys = Arrays.asList("soak:fence:" + name.name(), "soak:counter:" + name.name());
            Long fence = null;
            Long value = null;
            char write = 'N';
            long newest = 0;
            try {
                List<Object> read = ledger.eval(RScript.Mode.READ_WRITE, FENCE_SCRIPT, ARRAY,
                        new ArrayList<>(keys));
                fence = asLong(read.get(0));
                value = asLong(read.get(1));
            } catch (Exception e) {
                counters.add("section read error: java " + e.getClass().getSimpleName());
            }
            sleepNanos(hold);
            if (fence != null) {
                try {
                    List<Object> reply = ledger.eval(RScript.Mode.READ_WRITE, CAS_SCRIPT, ARRAY,
                            new ArrayList<>(keys), fence.toString(), Long.toString(value + 1));
                    newest = asLong(reply.get(1));
                    long code = asLong(reply.get(0));
                    write = code == 1 ? 'A' : code == 0 ? 'R' : 'F';
                } catch (Exception e) {
                    write = 'U';
                    counters.add("section write error: java " + e.getClass().getSimpleName());
                }
            }
            long end = System.nanoTime();
            long lost = end > validUntil ? validUntil : -1;
            if (lost < 0) {
                valid.incrementAndGet();
            }
            // name start end fence lost write newest wait op proxied worker task
            return name.index() + " " + start + " " + end + " " + (fence == null ? -1 : fence) + " " + lost
                    + " " + write + " " + newest + " " + (start - called) + " " + label + " "
                    + (proxied ? 1 : 0) + " " + id + " " + task;
        }

        /** A line in the worker's log (stderr), stamped with the soak's clock. */
        private void log(String what) {
            System.err.println("mono " + System.nanoTime() + " ns: java worker " + id + " task " + task
                    + (proxied ? " (proxied)" : " (direct)") + ": " + what);
        }

        /** A script's integer reply, however the codec hands it over. */
        private static long asLong(Object reply) {
            return reply instanceof Number n ? n.longValue() : Long.parseLong(reply.toString());
        }

        /** Mostly under 2 ms; sometimes up to 20 ms; rarely long enough to outlive a short lease. */
        private long pickHold() {
            int x = rng.nextInt(100);
            if (x < 94) {
                return TimeUnit.MICROSECONDS.toNanos(rng.nextInt(2000));
            }
            if (x < 99) {
                return TimeUnit.MILLISECONDS.toNanos(2 + rng.nextInt(18));
            }
            return TimeUnit.MILLISECONDS.toNanos(50 + rng.nextInt(350));
        }

        private static void sleep(long ms) {
            sleepNanos(TimeUnit.MILLISECONDS.toNanos(ms));
        }

        private static void sleepNanos(long nanos) {
            try {
                TimeUnit.NANOSECONDS.sleep(nanos);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
    }
}
