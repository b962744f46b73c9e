// A JVM that keeps computing on a fixed thread pool.
//
// Usage: java -cp DIR Calc PIDFILE
//
// Four pool threads each compute a deterministic value f(i) for batches of
// integers; the main thread adds them up and prints `progress N` (N = items
// done so far). PIDFILE is written once the pool runs. On SIGTERM (handled
// with sun.misc.Signal) the main thread finishes the current batch,
// recomputes the sum of f(0..N) by itself and prints PASS or FAIL (exit 0
// or 1). It also checks that the pool still has its four threads and that
// they did all the work.

import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.ArrayList;
import java.util.List;
import java.util.Set;
import java.util.concurrent.Callable;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.ThreadPoolExecutor;
import java.util.concurrent.atomic.AtomicLong;

public class Calc {
    static final int WORKERS = 4;
    static final int BATCH = 64;
    static volatile boolean stop = false;
    static final Set<String> workers = ConcurrentHashMap.newKeySet();
    static final AtomicLong pooled = new AtomicLong();

    // Deterministic and not trivially optimised away: xorshift rounds plus a
    // small array walk, so the heap and the JIT both take part.
    static long f(long i) {
        long x = i * 0x9E3779B97F4A7C15L + 1;
        long[] t = new long[64];
        for (int r = 0; r < 20000; r++) {
            x ^= x << 13;
            x ^= x >>> 7;
            x ^= x << 17;
            t[r & 63] += x;
        }
        long s = 0;
        for (long v : t) s = s * 31 + v;
        return s;
    }

    public static void main(String[] args) throws Exception {
        sun.misc.Signal.handle(new sun.misc.Signal("TERM"), sig -> stop = true);
        ThreadPoolExecutor pool = (ThreadPoolExecutor) Executors.newFixedThreadPool(WORKERS);
        long n = 0;
        long sum = 0;
        boolean announced = false;
        while (!stop) {
            List<Callable<Long>> tasks = new ArrayList<>();
            for (long i = n; i < n + BATCH; i++) {
                final long k = i;
                tasks.add(() -> {
                    workers.add(Thread.currentThread().getName());
                    pooled.incrementAndGet();
                    Thread.sleep(1);
                    return f(k);
                });
            }
            for (Future<Long> r : pool.invokeAll(tasks)) sum += r.get();
            n += BATCH;
            System.out.println("progress " + n);
            System.out.flush();
            if (!announced && pool.getPoolSize() == WORKERS) {
                Path p = Path.of(args[0]);
                Path tmp = Path.of(args[0] + ".tmp");
                Files.writeString(tmp, Long.toString(ProcessHandle.current().pid()));
                Files.move(tmp, p, StandardCopyOption.ATOMIC_MOVE);
                announced = true;
            }
        }
        List<String> problems = new ArrayList<>();
        long want = 0;
        for (long i = 0; i < n; i++) want += f(i);
        if (want != sum) problems.add("sum of f(0.." + n + ") " + sum + " != recomputed " + want);
        if (pool.getPoolSize() != WORKERS) problems.add("pool has " + pool.getPoolSize() + " threads");
        if (workers.size() != WORKERS) problems.add("work done by " + workers);
        if (pooled.get() != n) problems.add("pool ran " + pooled.get() + " tasks, expected " + n);
        pool.shutdown();
        if (!problems.isEmpty()) {
            System.out.println("FAIL " + String.join("; ", problems));
            System.exit(1);
        }
        System.out.println("checked " + n + " items over " + workers.size() + " threads");
        System.out.println("PASS");
        System.exit(0);
    }
}
