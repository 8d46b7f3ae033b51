package redbaton.interop;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ThreadLocalRandom;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import java.util.concurrent.locks.LockSupport;

import org.redisson.api.RLock;
import org.redisson.api.RedissonClient;

/**
 * {@code Driver bench}: Java Redisson's side of redbaton's compare bench (benches/compare,
 * scenario {@code java}). One run warms the JIT up on every scenario (unrecorded, on names of its
 * own), then measures each once and prints one JSON line per scenario:
 *
 * <ul>
 *   <li>{@code uncontended}: one thread, {@code --iters} lock()+unlock() on one name; the
 *       latency of each, ns;
 *   <li>{@code many}: {@code --many-threads} threads lock()+unlock() random names among
 *       {@code --names} for {@code --secs}; acquisitions and seconds;
 *   <li>{@code wakeup}: two threads on one name without barging (a releaser asks again only once
 *       the other holds it), holding {@code --hold-us}: every hand-off goes to a parked waiter;
 *   <li>{@code contended}: {@code --tasks} threads on one name, barging allowed.
 * </ul>
 *
 * The last two print every acquisition as {@code [thread, call, acquired, released]} in
 * {@code System.nanoTime()} (CLOCK_MONOTONIC on Linux), which the bench analyses with the same
 * code as its own contenders'; a wait still pending at the end has acquired 0 and released = the
 * end. Every lock takes Redisson's watchdog lease, as redbaton's {@code lock()} does.
 */
final class Bench {
    private Bench() {}

    static void run(Map<String, String> opts) throws Exception {
        RedissonClient redisson = Driver.connect(opts);
        double secs = Double.parseDouble(opts.getOrDefault("secs", "3"));
        int iters = Integer.parseInt(opts.getOrDefault("iters", "2000"));
        long holdNs = TimeUnit.MICROSECONDS.toNanos(Long.parseLong(opts.getOrDefault("hold-us", "1000")));
        int names = Integer.parseInt(opts.getOrDefault("names", "1000"));
        int manyThreads = Integer.parseInt(opts.getOrDefault("many-threads", "64"));
        int tasks = Integer.parseInt(opts.getOrDefault("tasks", "16"));
        double warmup = Double.parseDouble(opts.getOrDefault("warmup-secs", "6"));

        // JIT warm-up: every path the measured runs take, long enough for the C2 compiler.
        uncontended(redisson, "bench:java:warm:uncontended", iters * 3);
        many(redisson, "bench:java:warm:many", names, manyThreads, warmup / 3);
        contended(redisson, "bench:java:warm:contended", tasks, true, holdNs, warmup / 3);
        contended(redisson, "bench:java:warm:wakeup", 2, false, holdNs, warmup / 3);

        System.out.println(new Json().put("scenario", "uncontended")
                .put("ns", uncontended(redisson, "bench:java:uncontended", iters)).toString());
        long[] many = many(redisson, "bench:java:many", names, manyThreads, secs);
        System.out.println(new Json().put("scenario", "many").put("acquisitions", many[0])
                .put("secs", many[1] / 1e9).toString());
        for (String scenario : new String[] {"wakeup", "contended"}) {
            boolean wakeup = scenario.equals("wakeup");
            Run run = contended(redisson, "bench:java:" + scenario, wakeup ? 2 : tasks, !wakeup, holdNs, secs);
            System.out.println(new Json().put("scenario", scenario).put("overlaps", run.overlaps)
                    .put("events", run.events).toString());
        }
        System.out.flush();
        Runtime.getRuntime().halt(0);
    }

    /** {@code iters} lock()+unlock() on {@code name}: each one's latency, ns. */
    private static List<Long> uncontended(RedissonClient redisson, String name, int iters) {
        RLock lock = redisson.getLock(name);
        List<Long> ns = new ArrayList<>(iters);
        for (int i = 0; i < iters; i++) {
            long t = System.nanoTime();
            lock.lock();
            lock.unlock();
            ns.add(System.nanoTime() - t);
        }
        return ns;
    }

    /** {@code threads} threads lock()+unlock() random names for {@code secs}: {acquisitions, ns}. */
    private static long[] many(RedissonClient redisson, String prefix, int names, int threads, double secs)
            throws InterruptedException {
        AtomicLong count = new AtomicLong();
        long start = System.nanoTime() + 50_000_000L;
        long end = start + (long) (secs * 1e9);
        List<Thread> all = new ArrayList<>();
        for (int t = 0; t < threads; t++) {
            Thread thread = new Thread(() -> {
                sleepUntil(start);
                while (System.nanoTime() < end) {
                    RLock lock = redisson.getLock(prefix + ":" + ThreadLocalRandom.current().nextInt(names));
                    lock.lock();
                    lock.unlock();
                    count.incrementAndGet();
                }
            });
            thread.start();
            all.add(thread);
        }
        for (Thread thread : all) {
            thread.join();
        }
        return new long[] {count.get(), System.nanoTime() - start};
    }

    private record Run(List<List<Long>> events, long overlaps) {}

    /** {@code tasks} threads on {@code name} for {@code secs}, each acquisition recorded. */
    private static Run contended(RedissonClient redisson, String name, int tasks, boolean barging, long holdNs,
            double secs) throws InterruptedException {
        long start = System.nanoTime() + 50_000_000L;
        long end = start + (long) (secs * 1e9);
        AtomicInteger holders = new AtomicInteger();
        AtomicLong overlaps = new AtomicLong();
        // Without barging, a releaser asks again only once the sequence of takes moved on.
        AtomicLong seq = new AtomicLong();
        Object moved = new Object();
        List<List<Long>> events = java.util.Collections.synchronizedList(new ArrayList<>());
        List<Thread> all = new ArrayList<>();
        for (int t = 0; t < tasks; t++) {
            long task = t;
            Thread thread = new Thread(() -> {
                RLock lock = redisson.getLock(name);
                sleepUntil(start);
                while (System.nanoTime() < end) {
                    long call = System.nanoTime();
                    boolean acquired;
                    try {
                        acquired = lock.tryLock(Math.max(0, end - call), TimeUnit.NANOSECONDS);
                    } catch (InterruptedException e) {
                        return;
                    }
                    if (!acquired) {
                        // Still waiting at the end: counted as a wait of (end - call).
                        events.add(List.of(task, call, 0L, Math.max(call, System.nanoTime())));
                        break;
                    }
                    long acq = System.nanoTime();
                    if (holders.getAndIncrement() != 0) {
                        overlaps.incrementAndGet();
                    }
                    long mine = seq.incrementAndGet();
                    synchronized (moved) {
                        moved.notifyAll();
                    }
                    sleepNanos(holdNs);
                    holders.decrementAndGet();
                    long rel = System.nanoTime();
                    lock.unlock();
                    events.add(List.of(task, call, acq, rel));
                    if (!barging && !awaitMove(seq, moved, mine, end + 50_000_000L)) {
                        break;
                    }
                }
            });
            thread.start();
            all.add(thread);
        }
        for (Thread thread : all) {
            thread.join();
        }
        return new Run(new ArrayList<>(events), overlaps.get());
    }

    /** Waits until {@code seq} passed {@code mine} or {@code deadline} (nanoTime); whether it did. */
    private static boolean awaitMove(AtomicLong seq, Object moved, long mine, long deadline) {
        synchronized (moved) {
            while (seq.get() <= mine) {
                long left = deadline - System.nanoTime();
                if (left <= 0) {
                    return false;
                }
                try {
                    TimeUnit.NANOSECONDS.timedWait(moved, left);
                } catch (InterruptedException e) {
                    return false;
                }
            }
        }
        return true;
    }

    /** Parks until {@code nanos} have passed (a park may end early). */
    private static void sleepNanos(long nanos) {
        long until = System.nanoTime() + nanos;
        for (long left = nanos; left > 0; left = until - System.nanoTime()) {
            LockSupport.parkNanos(left);
        }
    }

    private static void sleepUntil(long deadline) {
        sleepNanos(deadline - System.nanoTime());
    }
}
