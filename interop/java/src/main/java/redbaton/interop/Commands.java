package redbaton.interop;

import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.time.Instant;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.TimeUnit;

import org.redisson.api.RFencedLock;
import org.redisson.api.RLock;
import org.redisson.api.RPermitExpirableSemaphore;
import org.redisson.api.RSemaphore;
import org.redisson.api.RedissonClient;

/**
 * The commands of {@code Driver serve}. A line is {@code <id> ping} or
 * {@code <id> <op> <thread> <args...>}; the answer is one JSON line
 * {@code {"id":..,"ok":true,"value":..,"t0":..,"t1":..,"tid":..}} or
 * {@code {"id":..,"ok":false,"error":"<exception class>","message":".."}}.
 *
 * <p>{@code <thread>} is a number the caller picks: each is one Java thread of its own, so
 * that Redisson's owner ({@code <client uuid>:<thread id>}) is that thread's, and its commands
 * run in order on it (a waiting {@code lock} blocks that thread, as in a Java service). Commands
 * of different threads run concurrently. {@code tid} is the Java thread id, {@code t0} and
 * {@code t1} the wall clock in milliseconds (fractional) before and after the call.
 *
 * <p>Names travel hex-encoded (UTF-8), so braces, spaces and any Unicode pass unchanged.
 * {@code <kind>} is {@code lock} (RLock), {@code fair} (RFairLock), {@code read} / {@code write}
 * (the halves of RReadWriteLock), {@code fenced} (RFencedLock) or {@code multi}
 * (RedissonMultiLock; its name is a comma-separated list of {@code <kind>/<hex name>}).
 * A lease or wait of {@code -} is none: the watchdog's lease, no waiting.
 *
 * <pre>
 * lock T KIND NAME LEASE          lock() / lock(lease)                       value: null
 * try T KIND NAME WAIT LEASE      tryLock() / tryLock(wait) / tryLock(wait, lease)   value: acquired
 * unlock T KIND NAME              unlock()
 * force T KIND NAME               forceUnlock()                              value: deleted
 * count T KIND NAME               getHoldCount()
 * locked T KIND NAME              isLocked()
 * held T KIND NAME                isHeldByCurrentThread()
 * ttl T KIND NAME                 remainTimeToLive()
 * token T NAME                    RFencedLock.getToken()
 * locktoken T NAME                lockAndGetToken()
 * trytoken T NAME WAIT LEASE      tryLockAndGetToken(wait[, lease])          value: token or null
 * sem-set T NAME N                RSemaphore.trySetPermits(n)
 * sem-acquire T NAME N            acquire(n)
 * sem-try T NAME N WAIT           tryAcquire(n) / tryAcquire(n, wait)
 * sem-release T NAME N            release(n)
 * sem-add T NAME N                addPermits(n)
 * sem-avail T NAME                availablePermits()
 * sem-drain T NAME                drainPermits()
 * lsem-set T NAME N               RPermitExpirableSemaphore.trySetPermits(n)
 * lsem-acquire T NAME LEASE       acquire() / acquire(lease)                 value: permit id
 * lsem-try T NAME WAIT LEASE      tryAcquire() / tryAcquire(wait[, lease])   value: permit id or null
 * lsem-release T NAME ID          release(id)
 * lsem-tryrelease T NAME ID       tryRelease(id)
 * lsem-update T NAME ID LEASE     updateLeaseTime(id, lease)
 * lsem-add T NAME N               addPermits(n)
 * lsem-avail T NAME               availablePermits()
 * lsem-acquired T NAME            acquiredPermits()
 * tid T                           value: the Java thread id (owner fields are {@code <uuid>:<tid>})
 * </pre>
 */
final class Commands {
    private final RedissonClient redisson;
    private final Map<String, ExecutorService> threads = new ConcurrentHashMap<>();
    /** Lock objects per thread and name, as a Java thread keeps its RLock. */
    private final Map<String, RLock> locks = new ConcurrentHashMap<>();
    private final PrintStream out =
            new PrintStream(new java.io.FileOutputStream(java.io.FileDescriptor.out), true, StandardCharsets.UTF_8);

    Commands(RedissonClient redisson) {
        this.redisson = redisson;
    }

    /** The wall clock in milliseconds, to the microsecond. */
    static double now() {
        Instant t = Instant.now();
        return t.getEpochSecond() * 1000.0 + t.getNano() / 1e6;
    }

    static String decode(String hex) {
        return new String(HexFormat.of().parseHex(hex), StandardCharsets.UTF_8);
    }

    synchronized void emit(String line) {
        out.println(line);
    }

    /** Runs one command line on its thread; its answer is emitted when it is done. */
    void submit(String line) {
        String[] words = line.split("\\s+");
        String id = words[0];
        if (words.length == 2 && words[1].equals("ping")) {
            emit(new Json().put("id", id).put("ok", true).toString());
            return;
        }
        if (words.length < 3) {
            emit(failure(id, new IllegalArgumentException("bad command: " + line)));
            return;
        }
        ExecutorService thread = threads.computeIfAbsent(words[2], n -> Executors.newSingleThreadExecutor(r -> {
            Thread t = new Thread(r, "driver-" + n);
            t.setDaemon(true);
            return t;
        }));
        thread.execute(() -> {
            double t0 = now();
            String reply;
            try {
                Object value = run(words);
                reply = new Json().put("id", id).put("ok", true).put("value", value)
                        .put("t0", t0).put("t1", now()).put("tid", Thread.currentThread().getId()).toString();
            } catch (Exception e) {
                reply = failure(id, e);
            }
            emit(reply);
        });
    }

    /** The reply for a call that threw {@code e}: its class, and its message with its causes'. */
    private static String failure(String id, Exception e) {
        StringBuilder message = new StringBuilder(String.valueOf(e.getMessage()));
        for (Throwable cause = e.getCause(); cause != null && cause != cause.getCause(); cause = cause.getCause()) {
            message.append(" (caused by ").append(cause.getClass().getSimpleName()).append(": ")
                    .append(cause.getMessage()).append(')');
        }
        return new Json().put("id", id).put("ok", false).put("error", e.getClass().getSimpleName())
                .put("message", message.toString()).toString();
    }

    /** A lease or wait in ms; {@code -} is none (-1, Redisson's "no lease"). */
    private static long ms(String word) {
        return word.equals("-") ? -1 : Long.parseLong(word);
    }

    private RLock lock(String thread, String kind, String name) {
        return locks.computeIfAbsent(thread + "/" + kind + "/" + name, k -> newLock(thread, kind, name));
    }

    private RLock newLock(String thread, String kind, String name) {
        if (kind.equals("multi")) {
            List<RLock> parts = new ArrayList<>();
            for (String part : name.split(",")) {
                String[] kindName = part.split("/", 2);
                parts.add(lock(thread, kindName[0], kindName[1]));
            }
            return redisson.getMultiLock(parts.toArray(new RLock[0]));
        }
        String plain = decode(name);
        return switch (kind) {
            case "lock" -> redisson.getLock(plain);
            case "fair" -> redisson.getFairLock(plain);
            case "read" -> redisson.getReadWriteLock(plain).readLock();
            case "write" -> redisson.getReadWriteLock(plain).writeLock();
            case "fenced" -> redisson.getFencedLock(plain);
            default -> throw new IllegalArgumentException("unknown kind: " + kind);
        };
    }

    private Object run(String[] w) throws Exception {
        String op = w[1];
        String t = w[2];
        switch (op) {
            case "tid" -> {
                return Thread.currentThread().getId();
            }
            case "lock" -> {
                long lease = ms(w[5]);
                RLock lock = lock(t, w[3], w[4]);
                if (lease < 0) {
                    lock.lock();
                } else {
                    lock.lock(lease, TimeUnit.MILLISECONDS);
                }
                return null;
            }
            case "try" -> {
                RLock lock = lock(t, w[3], w[4]);
                long wait = ms(w[5]);
                long lease = ms(w[6]);
                if (wait < 0 && lease < 0) {
                    return lock.tryLock();
                }
                if (lease < 0) {
                    return lock.tryLock(wait, TimeUnit.MILLISECONDS);
                }
                return lock.tryLock(Math.max(wait, 0), lease, TimeUnit.MILLISECONDS);
            }
            case "unlock" -> {
                lock(t, w[3], w[4]).unlock();
                return null;
            }
            case "force" -> {
                return lock(t, w[3], w[4]).forceUnlock();
            }
            case "count" -> {
                return lock(t, w[3], w[4]).getHoldCount();
            }
            case "locked" -> {
                return lock(t, w[3], w[4]).isLocked();
            }
            case "held" -> {
                return lock(t, w[3], w[4]).isHeldByCurrentThread();
            }
            case "ttl" -> {
                return lock(t, w[3], w[4]).remainTimeToLive();
            }
            case "token" -> {
                return fenced(t, w[3]).getToken();
            }
            case "locktoken" -> {
                return fenced(t, w[3]).lockAndGetToken();
            }
            case "trytoken" -> {
                long wait = ms(w[4]);
                long lease = ms(w[5]);
                RFencedLock lock = fenced(t, w[3]);
                return lease < 0
                        ? lock.tryLockAndGetToken(wait, TimeUnit.MILLISECONDS)
                        : lock.tryLockAndGetToken(wait, lease, TimeUnit.MILLISECONDS);
            }
            default -> {
                return op.startsWith("sem-") ? semaphore(op, w) : leased(op, w);
            }
        }
    }

    private RFencedLock fenced(String thread, String name) {
        return (RFencedLock) lock(thread, "fenced", name);
    }

    private Object semaphore(String op, String[] w) throws Exception {
        RSemaphore sem = redisson.getSemaphore(decode(w[3]));
        return switch (op) {
            case "sem-set" -> sem.trySetPermits(Integer.parseInt(w[4]));
            case "sem-acquire" -> {
                sem.acquire(Integer.parseInt(w[4]));
                yield null;
            }
            case "sem-try" -> {
                int n = Integer.parseInt(w[4]);
                long wait = ms(w[5]);
                yield wait < 0 ? sem.tryAcquire(n) : sem.tryAcquire(n, wait, TimeUnit.MILLISECONDS);
            }
            case "sem-release" -> {
                sem.release(Integer.parseInt(w[4]));
                yield null;
            }
            case "sem-add" -> {
                sem.addPermits(Integer.parseInt(w[4]));
                yield null;
            }
            case "sem-avail" -> sem.availablePermits();
            case "sem-drain" -> sem.drainPermits();
            default -> throw new IllegalArgumentException("unknown command: " + op);
        };
    }

    private Object leased(String op, String[] w) throws Exception {
        RPermitExpirableSemaphore sem = redisson.getPermitExpirableSemaphore(decode(w[3]));
        return switch (op) {
            case "lsem-set" -> sem.trySetPermits(Integer.parseInt(w[4]));
            case "lsem-acquire" -> {
                long lease = ms(w[4]);
                yield lease < 0 ? sem.acquire() : sem.acquire(lease, TimeUnit.MILLISECONDS);
            }
            case "lsem-try" -> {
                long wait = ms(w[4]);
                long lease = ms(w[5]);
                if (wait < 0 && lease < 0) {
                    yield sem.tryAcquire();
                }
                if (lease < 0) {
                    yield sem.tryAcquire(wait, TimeUnit.MILLISECONDS);
                }
                yield sem.tryAcquire(Math.max(wait, 0), lease, TimeUnit.MILLISECONDS);
            }
            case "lsem-release" -> {
                sem.release(w[4]);
                yield null;
            }
            case "lsem-tryrelease" -> sem.tryRelease(w[4]);
            case "lsem-update" -> sem.updateLeaseTime(w[4], Long.parseLong(w[5]), TimeUnit.MILLISECONDS);
            case "lsem-add" -> {
                sem.addPermits(Integer.parseInt(w[4]));
                yield null;
            }
            case "lsem-avail" -> sem.availablePermits();
            case "lsem-acquired" -> sem.acquiredPermits();
            default -> throw new IllegalArgumentException("unknown command: " + op);
        };
    }
}
