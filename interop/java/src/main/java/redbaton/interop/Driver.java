package redbaton.interop;

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;

import org.redisson.Redisson;
import org.redisson.api.RedissonClient;
import org.redisson.config.ClusterServersConfig;
import org.redisson.config.Config;
import org.redisson.config.ShardedSubscriptionMode;

/**
 * Drives the real Java Redisson for redbaton's interop tests (tests/redisson.rs), the mixed
 * soak (soak/) and the compare bench. The Rust side starts the redis-server (or
 * cluster), runs this program as a child process on loopback and drives redbaton on the same
 * server and names.
 *
 * <pre>
 * java -cp CLASSPATH redbaton.interop.Driver serve [CONNECTION]
 * java -cp CLASSPATH redbaton.interop.Driver bench [CONNECTION] --scenario S ...
 * java -cp CLASSPATH redbaton.interop.Driver soak  [CONNECTION] --dir D ...
 *
 * CONNECTION: --nodes 127.0.0.1:P[,127.0.0.1:Q...]  one address: a single server
 *             --cluster                              the nodes are a Redis Cluster's
 *             --sharded on|off                       cluster only: shardedSubscriptionMode
 *             --watchdog MS                          lockWatchdogTimeout (default 30000)
 *             --timeout MS                           command timeout (default 3000)
 *             --retries N                            retryAttempts (default Redisson's, 4)
 *             --fair-wait MS                         fairLockWaitTimeout (default 300000)
 * </pre>
 *
 * {@code serve} reads one command a line on stdin and answers each with one JSON line on
 * stdout; see {@link Commands} for the commands. The first line printed is
 * {@code {"ready":true,"id":"<client uuid>","version":"<Redisson version>"}}. End of stdin
 * ends the process.
 */
public final class Driver {
    private Driver() {}

    /** Options as {@code --key value} pairs (a flag without value maps to "true"). */
    static Map<String, String> options(String[] args, int from) {
        Map<String, String> out = new HashMap<>();
        for (int i = from; i < args.length; i++) {
            if (!args[i].startsWith("--")) {
                throw new IllegalArgumentException("bad argument: " + args[i]);
            }
            String key = args[i].substring(2);
            if (i + 1 < args.length && !args[i + 1].startsWith("--")) {
                out.put(key, args[++i]);
            } else {
                out.put(key, "true");
            }
        }
        return out;
    }

    /** A Redisson client for the connection options. */
    static RedissonClient connect(Map<String, String> opts) {
        String nodes = opts.get("nodes");
        if (nodes == null) {
            throw new IllegalArgumentException("--nodes is required");
        }
        List<String> addresses = new ArrayList<>();
        for (String node : nodes.split(",")) {
            addresses.add("redis://" + node);
        }
        Config config = new Config();
        config.setLockWatchdogTimeout(Long.parseLong(opts.getOrDefault("watchdog", "30000")));
        if (opts.containsKey("fair-wait")) {
            config.setFairLockWaitTimeout(Long.parseLong(opts.get("fair-wait")));
        }
        int timeout = Integer.parseInt(opts.getOrDefault("timeout", "3000"));
        Integer retries = opts.containsKey("retries") ? Integer.valueOf(opts.get("retries")) : null;
        if (opts.containsKey("cluster")) {
            ClusterServersConfig cluster = config.useClusterServers();
            for (String address : addresses) {
                cluster.addNodeAddress(address);
            }
            cluster.setTimeout(timeout);
            if (retries != null) {
                cluster.setRetryAttempts(retries);
            }
            String sharded = opts.getOrDefault("sharded", "off");
            cluster.setShardedSubscriptionMode(
                    "on".equals(sharded) ? ShardedSubscriptionMode.ON : ShardedSubscriptionMode.OFF);
        } else {
            if (addresses.size() != 1) {
                throw new IllegalArgumentException("a single server takes one address; add --cluster");
            }
            var single = config.useSingleServer().setAddress(addresses.get(0)).setTimeout(timeout);
            if (retries != null) {
                single.setRetryAttempts(retries);
            }
        }
        return Redisson.create(config);
    }

    /** The Redisson version on the class path (from its jar's manifest). */
    static String redissonVersion() {
        String v = Redisson.class.getPackage().getImplementationVersion();
        return v == null ? "unknown" : v;
    }

    public static void main(String[] args) throws Exception {
        if (args.length == 0) {
            usage();
        }
        // Redisson's warnings and errors only (slf4j-simple's default, info, logs every connect).
        if (System.getProperty("org.slf4j.simpleLogger.defaultLogLevel") == null) {
            System.setProperty("org.slf4j.simpleLogger.defaultLogLevel", "warn");
        }
        Map<String, String> opts = options(args, 1);
        switch (args[0]) {
            case "serve" -> serve(opts);
            case "bench" -> Bench.run(opts);
            case "soak" -> Soak.run(opts);
            default -> usage();
        }
    }

    private static void usage() {
        System.err.println("usage: Driver serve|bench|soak --nodes HOST:PORT[,...] [--cluster] ...");
        System.exit(64);
    }

    private static void serve(Map<String, String> opts) throws Exception {
        RedissonClient redisson = connect(opts);
        Commands commands = new Commands(redisson);
        Json ready = new Json().put("ready", true).put("id", redisson.getId())
                .put("version", redissonVersion());
        commands.emit(ready.toString());
        BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
        String line;
        while ((line = in.readLine()) != null) {
            if (!line.isBlank()) {
                commands.submit(line.trim());
            }
        }
        // End of input: a waiting lock may never end, so do not wait for it (nor for shutdown).
        Runtime.getRuntime().halt(0);
    }
}
