package io.pymq.spark;

import java.util.ArrayList;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * Broker connections kept between tasks in one executor JVM, bounded and keyed by connection options and
 * worker (the Python data source's {@code _connections.py} keeps one per Python worker): a task takes an
 * idle one instead of paying a STOMP handshake per partition.  At most {@link #LIMIT} idle connections,
 * least recently used out first; a connection that failed, or that still has answers on their way (a task
 * that stopped early), is never kept.
 */
final class Connections {
    static final int LIMIT = 4;
    /** Connections tried to reach a destination's owning worker (the kernel spreads them over workers). */
    static final int OWNER_ATTEMPTS = 16;

    private record Key(Options.Connection options, int worker) {
    }

    private static final LinkedHashMap<Key, List<StompClient>> IDLE = new LinkedHashMap<>(16, 0.75f, true);
    private static int idle;

    private Connections() {
    }

    /** An open connection; with {@code worker >= 0} preferably one that lives in that worker. */
    static StompClient take(Options.Connection options, int worker) {
        StompClient c = poll(new Key(options, worker));
        if (c != null) {
            return c;
        }
        if (worker < 0) {
            return StompClient.connect(options);
        }
        // SO_REUSEPORT hands a new connection to any worker: connect until one lands on the owner, keeping
        // the others for the tasks that read their destinations (bounded; any worker can serve in the end,
        // forwarding to the owner)
        StompClient other = null;
        for (int attempt = 0; attempt < OWNER_ATTEMPTS; attempt++) {
            StompClient candidate = StompClient.connect(options);
            if (candidate.worker == worker || candidate.worker < 0) {
                if (other != null) {
                    give(options, other.worker, other);
                }
                return candidate;
            }
            if (other != null) {
                give(options, other.worker, other);
            }
            other = candidate;
        }
        return other;
    }

    private static synchronized StompClient poll(Key key) {
        List<StompClient> list = IDLE.get(key);
        while (list != null && !list.isEmpty()) {
            StompClient c = list.remove(list.size() - 1);
            idle--;
            if (list.isEmpty()) {
                IDLE.remove(key);
            }
            if (c.usable()) {
                return c;
            }
            closeQuietly(c);
        }
        return null;
    }

    /** Back to the cache, if it is clean; closed otherwise. */
    static void give(Options.Connection options, int worker, StompClient c) {
        if (!c.usable()) {
            closeQuietly(c);
            return;
        }
        List<StompClient> evicted = new ArrayList<>();
        synchronized (Connections.class) {
            IDLE.computeIfAbsent(new Key(options, worker < 0 ? -1 : c.worker), k -> new ArrayList<>()).add(c);
            idle++;
            Iterator<Map.Entry<Key, List<StompClient>>> it = IDLE.entrySet().iterator();
            while (idle > LIMIT && it.hasNext()) {
                List<StompClient> oldest = it.next().getValue();
                while (!oldest.isEmpty() && idle > LIMIT) {
                    evicted.add(oldest.remove(0));
                    idle--;
                }
                if (oldest.isEmpty()) {
                    it.remove();
                }
            }
        }
        for (StompClient e : evicted) {
            closeQuietly(e);
        }
    }

    static void closeQuietly(StompClient c) {
        try {
            c.close();
        } catch (RuntimeException ignored) {
            // a connection that already failed has nothing left to release
        }
    }

    static synchronized int idleCount() {
        return idle;
    }
}
