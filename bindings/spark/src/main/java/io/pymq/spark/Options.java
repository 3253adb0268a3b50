package io.pymq.spark;

import com.fasterxml.jackson.core.JsonProcessingException;
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import io.pymq.selector.Selector;

import java.io.Serializable;
import java.net.URI;
import java.net.URISyntaxException;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.TreeMap;
import java.util.TreeSet;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

/**
 * The data source's options, parsed into frozen, serializable values: the same names, defaults, rules and
 * error sentences as the Python data source ({@code pyspark_pymq/_options.py}; user table:
 * pyspark_pymq/README.md), so a query runs unchanged on either implementation and a wrong option is
 * refused with the same words when the DataFrame is defined, before any job.  Nothing here does I/O.
 */
final class Options {
    private Options() {
    }

    static final long EARLIEST = -2;
    static final long LATEST = -1;
    static final ObjectMapper JSON = new ObjectMapper();

    /** Options Spark itself may hand a data source; accepted and ignored. */
    private static final Set<String> SPARK_OWN = Set.of("path", "checkpointlocation", "queryname",
            "__partition_columns");

    static final List<String> READ_NAMES = List.of(
            "url", "queue", "topic", "destinations", "destinationPattern", "mode", "subscription", "selector",
            "startingOffsets", "endingOffsets", "startingTimestamp", "startingOffsetsByTimestamp",
            "endingTimestamp", "endingOffsetsByTimestamp", "maxMessagesPerTrigger", "maxOffsetsPerTrigger",
            "minMessagesPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay", "maxBytesPerTrigger",
            "minPartitions", "maxMessagesPerPartition", "maxBytesPerPartition", "failOnDataLoss",
            "includeProperties", "fetchSize", "fetchRetries", "fetchRetryIntervalMs", "filterPushdown");
    static final List<String> WRITE_NAMES = List.of(
            "url", "destination", "queue", "topic", "dedup", "dedupPrefix", "transactionSize", "deliveryMode",
            "priority", "timeToLive", "arrow");
    private static final Map<String, String> SPELLING = new LinkedHashMap<>();

    static {
        for (String n : READ_NAMES) {
            SPELLING.put(n.toLowerCase(Locale.ROOT), n);
        }
        for (String n : WRITE_NAMES) {
            SPELLING.put(n.toLowerCase(Locale.ROOT), n);
        }
    }

    /** Lower-cased keys, null values as empty strings (Spark's options are case-insensitive). */
    static Map<String, String> lower(Map<String, String> options) {
        Map<String, String> out = new TreeMap<>();
        for (Map.Entry<String, String> e : options.entrySet()) {
            out.put(e.getKey().toLowerCase(Locale.ROOT), e.getValue() == null ? "" : e.getValue());
        }
        return out;
    }

    private static String get(Map<String, String> opts, String name) {
        String v = opts.get(name.toLowerCase(Locale.ROOT));
        return v == null ? "" : v;
    }

    private static boolean given(Map<String, String> opts, String name) {
        return !get(opts, name).strip().isEmpty();
    }

    static String spelled(String key) {
        return SPELLING.getOrDefault(key, key);
    }

    private static void checkKnown(Map<String, String> opts, List<String> allowed, String what) {
        Set<String> lowered = new TreeSet<>();
        for (String a : allowed) {
            lowered.add(a.toLowerCase(Locale.ROOT));
        }
        for (String key : opts.keySet()) {
            if (lowered.contains(key) || key.startsWith("pymq.") || SPARK_OWN.contains(key)) {
                continue;
            }
            String close = Similar.closest(key, lowered);
            String hint = close != null ? "; did you mean '" + SPELLING.get(close) + "'?"
                    : "; known options: " + String.join(", ", sortedSpellings(lowered));
            throw PymqException.config("unknown " + what + " option '" + key + "'" + hint);
        }
    }

    private static List<String> sortedSpellings(Set<String> lowered) {
        List<String> out = new ArrayList<>();
        for (String k : lowered) {
            out.add(SPELLING.get(k));
        }
        out.sort(null);
        return out;
    }

    private static String alias(Map<String, String> opts, String... names) {
        List<String> found = new ArrayList<>();
        for (String n : names) {
            if (given(opts, n)) {
                found.add(n);
            }
        }
        if (found.size() > 1) {
            StringBuilder b = new StringBuilder("options ");
            for (int i = 0; i < found.size(); i++) {
                b.append(i == 0 ? "" : " and ").append('\'').append(found.get(i)).append('\'');
            }
            throw PymqException.config(b + " mean the same; give one");
        }
        return found.isEmpty() ? null : found.get(0);
    }

    static boolean bool(Map<String, String> opts, String key, boolean fallback) {
        String raw = get(opts, key);
        if (raw.isEmpty()) {
            return fallback;
        }
        String v = raw.strip().toLowerCase(Locale.ROOT);
        if (v.equals("true") || v.equals("1") || v.equals("yes")) {
            return true;
        }
        if (v.equals("false") || v.equals("0") || v.equals("no")) {
            return false;
        }
        throw PymqException.config("option '" + key + "' must be true or false, got " + pyRepr(raw));
    }

    static Long optLong(Map<String, String> opts, String key, long minimum) {
        String raw = get(opts, key);
        if (raw.strip().isEmpty()) {
            return null;
        }
        long value;
        try {
            value = Long.parseLong(raw.strip());
        } catch (NumberFormatException e) {
            throw PymqException.config("option '" + key + "' must be an integer, got " + pyRepr(raw));
        }
        if (value < minimum) {
            throw PymqException.config("option '" + key + "' must be at least " + minimum + ", got " + value);
        }
        return value;
    }

    static long integer(Map<String, String> opts, String key, long fallback, long minimum) {
        Long v = optLong(opts, key, minimum);
        return v == null ? fallback : v;
    }

    /** Python's repr of a string, for messages that quote a value as the Python data source does. */
    static String pyRepr(String s) {
        return s.contains("'") && !s.contains("\"") ? "\"" + s + "\"" : "'" + s.replace("'", "\\'") + "'";
    }

    private static final Pattern DURATION = Pattern.compile("(\\d+)\\s*(ms|s|sec|m|min|h|d)?");

    static long durationMs(String raw, String what) {
        Matcher m = DURATION.matcher(raw.strip().toLowerCase(Locale.ROOT));
        if (!m.matches()) {
            throw PymqException.config("option '" + what + "' must be a duration such as 15m, 30s, 500ms or 2h, got "
                    + pyRepr(raw));
        }
        long n = Long.parseLong(m.group(1));
        String unit = m.group(2);
        long per = unit == null || unit.equals("ms") ? 1 : switch (unit) {
            case "s", "sec" -> 1000;
            case "m", "min" -> 60_000;
            case "h" -> 3_600_000;
            default -> 86_400_000;
        };
        return n * per;
    }

    // -- destinations ----------------------------------------------------------------------------------

    static final String QUEUE = "/queue/";
    static final String TOPIC = "/topic/";

    static String kind(String stompName) {
        return stompName.startsWith(TOPIC) ? "topic" : "queue";
    }

    /** A STOMP name from an option value: a bare name of {@code kind} ("queue"/"topic"; null: must be a
     * STOMP name), checked as pymq.destination checks it. */
    static String destination(String raw, String kind, String what) {
        String name;
        if (kind != null && !raw.startsWith("/")) {
            if (raw.isEmpty()) {
                throw PymqException.config("option '" + what + "': " + (kind.equals("queue") ? "Queue" : "Topic")
                        + " needs a non-empty name, got ''");
            }
            return (kind.equals("queue") ? QUEUE : TOPIC) + raw;
        }
        String[][] prefixes = {{"/temp-queue/", "TemporaryQueue"}, {"/temp-topic/", "TemporaryTopic"},
                {QUEUE, "Queue"}, {TOPIC, "Topic"}};
        String found = null;
        String cls = null;
        for (String[] p : prefixes) {
            if (raw.startsWith(p[0])) {
                found = p[0];
                cls = p[1];
                break;
            }
        }
        if (found == null) {
            throw PymqException.config("option '" + what + "': destination " + pyRepr(raw) + " must be a Queue, a "
                    + "Topic, or a string starting with /queue/, /topic/, /temp-queue/ or /temp-topic/");
        }
        name = raw.substring(found.length());
        if (name.isEmpty()) {
            throw PymqException.config("option '" + what + "': " + cls + " needs a non-empty name, got ''");
        }
        boolean isQueue = found.equals(QUEUE) || found.equals("/temp-queue/");
        if (kind != null && isQueue != kind.equals("queue")) {
            throw PymqException.config("option '" + what + "' names " + raw + ", which is not a " + kind);
        }
        if (found.startsWith("/temp-")) {
            throw PymqException.config("option '" + what + "': " + raw + " is a temporary queue, private to the "
                    + "connection that made it; Spark tasks use their own connections");
        }
        return raw;
    }

    private static List<String> nameList(String raw, String what) {
        List<String> out = new ArrayList<>();
        for (String n : raw.split(",", -1)) {
            out.add(n.strip());
        }
        if (raw.strip().isEmpty() || out.stream().anyMatch(String::isEmpty)) {
            throw PymqException.config("option '" + what + "' must be a comma-separated list of names, got "
                    + pyRepr(raw));
        }
        return out;
    }

    /** {@code earliest} | {@code latest} | JSON {"/queue/x": {"0": seq}}; with timestamps, JSON of ms. */
    private static Object offsets(String raw, String what, List<String> destinations, String namedKind,
                                  boolean allowEarliest, boolean timestamps) {
        String value = raw.strip();
        if (timestamps && !value.startsWith("{")) {
            throw PymqException.config("option '" + what + "' must be JSON like {\"/topic/orders\": {\"0\": "
                    + "1700000000000}} (ms since the epoch per destination), got " + pyRepr(raw));
        }
        String low = value.toLowerCase(Locale.ROOT);
        if (low.equals("earliest") || low.equals("latest")) {
            if (low.equals("earliest") && !allowEarliest) {
                throw PymqException.config("option '" + what + "' cannot be 'earliest'");
            }
            return low;
        }
        JsonNode parsed;
        try {
            parsed = JSON.readTree(value);
        } catch (JsonProcessingException e) {
            parsed = null;
        }
        if (parsed == null) {
            throw PymqException.config("option '" + what + "' must be 'earliest', 'latest' or JSON like "
                    + "{\"/queue/orders\": {\"0\": 42}}, got " + pyRepr(raw));
        }
        if (!parsed.isObject()) {
            throw PymqException.config("option '" + what + "' JSON must be an object of destination -> "
                    + "{partition: offset}");
        }
        Map<String, Long> out = new TreeMap<>();
        Iterator<Map.Entry<String, JsonNode>> it = parsed.fields();
        while (it.hasNext()) {
            Map.Entry<String, JsonNode> e = it.next();
            String dest = destination(e.getKey(), namedKind, what);
            if (destinations != null && !destinations.contains(dest)) {
                throw PymqException.config("option '" + what + "' names " + dest + ", which the query does not read "
                        + "(it reads " + String.join(", ", destinations) + ")");
            }
            JsonNode parts = e.getValue();
            if (!parts.isObject() || parts.size() != 1 || !parts.has("0")) {
                throw PymqException.config("option '" + what + "': " + dest + " must map partition \"0\" (pymq "
                        + "destinations have one partition) to an offset, got " + parts);
            }
            JsonNode seq = parts.get("0");
            boolean integral = seq.isIntegralNumber() && seq.canConvertToLong();
            if (timestamps) {
                if (!integral || seq.asLong() < 0) {
                    throw PymqException.config("option '" + what + "': the timestamp of " + dest + " must be ms "
                            + "since the epoch (>= 0), got " + seq);
                }
            } else if (!integral || seq.asLong() < EARLIEST || (seq.asLong() == EARLIEST && !allowEarliest)) {
                String allowed = allowEarliest ? "-2 (earliest), -1 (latest)" : "-1 (latest)";
                throw PymqException.config("option '" + what + "': the offset of " + dest + " must be a sequence "
                        + "number (>= 0), " + allowed + "; got " + seq);
            }
            out.put(dest, seq.asLong());
        }
        return out;
    }

    private static void oneOf(Map<String, String> opts, String... names) {
        List<String> found = new ArrayList<>();
        for (String n : names) {
            if (given(opts, n)) {
                found.add(n);
            }
        }
        if (found.size() > 1) {
            List<String> quoted = new ArrayList<>();
            for (String n : names) {
                quoted.add("'" + n + "'");
            }
            throw PymqException.config("give one of " + String.join(", ", quoted) + ", not "
                    + String.join(" and ", found));
        }
    }

    // -- connection ------------------------------------------------------------------------------------

    /** How to reach the broker: a value (keys the executors' connection cache; travels in partitions). */
    record Connection(String host, int port, boolean tls, String username, String password, double timeout,
                      long heartbeatSend, long heartbeatReceive, String vhost, String caFile, String certFile,
                      String keyFile, Boolean verify, String serverHostname) implements Serializable {
        long timeoutMs() {
            return Math.max(1, (long) (timeout * 1000));
        }

        @Override
        public String toString() {
            return "Connection(" + (tls ? "stomps://" : "stomp://") + host + ":" + port
                    + (username != null ? ", username=" + username : "") + (password != null ? ", password=***" : "")
                    + ")";
        }

        /** The same broker, another port (a worker's or a node's own listener). */
        Connection withPort(int other) {
            return new Connection(host, other, tls, username, password, timeout, heartbeatSend, heartbeatReceive,
                    vhost, caFile, certFile, keyFile, verify, serverHostname);
        }
    }

    private static final List<String> FACTORY_KEYWORDS = List.of("username", "password", "timeout", "heartbeat",
            "prefetch", "sync_send", "host", "tls");
    private static final List<String> TLS_FIELDS = List.of("ca_file", "cert_file", "key_file", "verify",
            "server_hostname");

    static String squash(String s) {
        return s.replace("_", "").toLowerCase(Locale.ROOT);
    }

    static Connection connection(Map<String, String> opts) {
        String url = get(opts, "url").strip();
        if (url.isEmpty()) {
            throw PymqException.config("option 'url' is required: the broker to use, e.g. stomp://127.0.0.1:61613");
        }
        URI uri;
        try {
            uri = new URI(url);
        } catch (URISyntaxException e) {
            throw PymqException.config("option 'url': bad URL " + pyRepr(url) + ": " + e.getMessage());
        }
        String scheme = uri.getScheme() == null ? "" : uri.getScheme().toLowerCase(Locale.ROOT);
        boolean tls;
        switch (scheme) {
            case "stomp", "tcp" -> tls = false;
            case "stomps", "stomp+ssl", "ssl", "stomp+tls" -> tls = true;
            case "vm" -> throw PymqException.config("option 'url' must be a stomp:// or stomps:// address that every "
                    + "Spark executor can reach, not an in-process vm:// broker");
            default -> throw PymqException.config("option 'url': unsupported URL " + pyRepr(url) + ": use "
                    + "stomp://host:port, stomps://host:port (TLS) or vm://name");
        }
        if (uri.getRawPath() != null && !uri.getRawPath().isEmpty() && !uri.getRawPath().equals("/")) {
            throw PymqException.config("option 'url': a STOMP URL has no path: " + pyRepr(url));
        }
        String host = uri.getHost() == null ? "127.0.0.1" : uri.getHost();
        int port = uri.getPort() > 0 ? uri.getPort() : (tls ? 61614 : 61613);
        String username = null;
        String password = null;
        if (uri.getRawUserInfo() != null) {
            String info = uri.getRawUserInfo();
            int colon = info.indexOf(':');
            username = decode(colon < 0 ? info : info.substring(0, colon));
            password = colon < 0 ? null : decode(info.substring(colon + 1));
        }
        Map<String, String> tlsQuery = new LinkedHashMap<>();
        if (uri.getRawQuery() != null && !uri.getRawQuery().isEmpty()) {
            for (String pair : uri.getRawQuery().split("&")) {
                int eq = pair.indexOf('=');
                if (eq < 0) {
                    throw PymqException.config("option 'url': bad query string in URL " + pyRepr(url)
                            + ": expected name=value&...");
                }
                String key = decode(pair.substring(0, eq));
                if (!TLS_FIELDS.contains(key)) {
                    throw PymqException.config("option 'url': unknown option " + pyRepr(key) + " in URL "
                            + pyRepr(url) + "; options are ca_file, cert_file, key_file, server_hostname, verify "
                            + "(on stomps:// URLs)");
                }
                if (!tls) {
                    throw PymqException.config("option 'url': TLS option " + pyRepr(key) + " on a plain " + scheme
                            + ":// URL " + pyRepr(url) + "; use stomps:// (or stomp+ssl://) for TLS");
                }
                tlsQuery.put(key, decode(pair.substring(eq + 1)));
            }
        }
        double timeout = 30.0;              // the connector's default: tasks wait longer on a busy cluster
        long[] heartbeat = {10_000, 10_000};
        String vhost = null;
        Map<String, String> tlsOpts = new LinkedHashMap<>(tlsQuery);
        boolean tlsOption = false;
        for (Map.Entry<String, String> e : opts.entrySet()) {
            String key = e.getKey();
            String raw = e.getValue();
            if (!key.startsWith("pymq.") || raw == null || raw.isEmpty()) {
                continue;
            }
            if (key.startsWith("pymq.tls.")) {
                String field = null;
                for (String f : TLS_FIELDS) {
                    if (squash(f).equals(squash(key.substring("pymq.tls.".length())))) {
                        field = f;
                    }
                }
                if (field == null) {
                    throw PymqException.config("unknown TLS option '" + key + "': the pymq.tls.* options are the "
                            + "fields of pymq.TlsOptions: pymq.tls.ca_file, pymq.tls.cert_file, pymq.tls.key_file, "
                            + "pymq.tls.verify, pymq.tls.server_hostname");
                }
                if (field.equals("verify")) {
                    bool(Map.of(key, raw), key, true);                // refuses what is not a boolean
                }
                tlsOpts.put(field, raw);
                tlsOption = true;
                continue;
            }
            String keyword = null;
            for (String k : FACTORY_KEYWORDS) {
                if (squash(k).equals(squash(key.substring("pymq.".length())))) {
                    keyword = k;
                }
            }
            if (squash(key.substring(5)).equals("clientid")) {
                throw PymqException.config("option 'pymq.clientId' is not supported: the driver and every executor "
                        + "task open their own connections, and a client id can be held by one live connection "
                        + "only. Durable subscriptions of the data source are scoped by the user name "
                        + "(pymq.username) instead");
            }
            if (keyword == null) {
                List<String> known = new ArrayList<>();
                for (String k : FACTORY_KEYWORDS) {
                    known.add("pymq." + k);
                }
                known.sort(null);
                String close = Similar.closest(key, known);
                throw PymqException.config("unknown connection option '" + key + "': "
                        + (close != null ? "did you mean '" + close + "'? " : "")
                        + "the pymq.* options are the keywords of pymq.ConnectionFactory: " + String.join(", ", known));
            }
            switch (keyword) {
                case "tls" -> throw PymqException.config("option '" + key + "': give TLS settings one by one "
                        + "(pymq.tls.caFile, pymq.tls.certFile, pymq.tls.keyFile, pymq.tls.verify, "
                        + "pymq.tls.serverHostname) or in the stomps:// URL's query");
                case "username" -> username = raw;
                case "password" -> password = raw;
                case "host" -> vhost = raw;
                case "timeout" -> {
                    try {
                        timeout = Double.parseDouble(raw.strip());
                    } catch (NumberFormatException ex) {
                        throw PymqException.config("option '" + key + "' must be a number, got " + pyRepr(raw));
                    }
                    if (!(timeout > 0)) {
                        throw PymqException.config("option '" + key + "' must be positive, got " + pyRepr(raw));
                    }
                }
                case "heartbeat" -> {
                    String[] parts = raw.strip().split(",", -1);
                    try {
                        if (parts.length != 2) {
                            throw new NumberFormatException();
                        }
                        heartbeat = new long[] {Long.parseLong(parts[0].strip()), Long.parseLong(parts[1].strip())};
                        if (heartbeat[0] < 0 || heartbeat[1] < 0) {
                            throw new NumberFormatException();
                        }
                    } catch (NumberFormatException ex) {
                        throw PymqException.config("option '" + key + "' must be two non-negative integers "
                                + "'send_ms,recv_ms', got " + pyRepr(raw));
                    }
                }
                case "prefetch" -> {
                    // a consumer's setting of the SDK: a range reader has no consumer; checked, not used
                    try {
                        Integer.parseInt(raw.strip());
                    } catch (NumberFormatException ex) {
                        throw PymqException.config("option '" + key + "' must be an integer, got " + pyRepr(raw));
                    }
                }
                case "sync_send" -> bool(Map.of(key, raw), key, true);       // every connector send waits anyway
                default -> {
                }
            }
        }
        if (tlsOption && !tls) {
            List<String> names = new ArrayList<>();
            for (String f : new TreeSet<>(tlsOpts.keySet())) {
                names.add("pymq.tls." + f);
            }
            throw PymqException.config("options " + String.join(", ", names) + " need a TLS URL "
                    + "(stomps://host:port), not " + scheme + "://");
        }
        String verify = tlsOpts.get("verify");
        return new Connection(host, port, tls, username, password, timeout, heartbeat[0], heartbeat[1], vhost,
                tlsOpts.get("ca_file"), tlsOpts.get("cert_file"), tlsOpts.get("key_file"),
                verify == null ? null : bool(Map.of("verify", verify), "verify", true),
                tlsOpts.get("server_hostname"));
    }

    private static String decode(String s) {
        return URLDecoder.decode(s.replace("+", "%2B"), StandardCharsets.UTF_8);
    }

    // -- reads -----------------------------------------------------------------------------------------

    /** The parsed read options (pyspark_pymq/README.md "Read options"). */
    record Read(Connection connection, List<String> destinations, String pattern, String mode, String subscription,
                String selector, Object starting, Long startingTimestamp, Map<String, Long> startingByTimestamp,
                Object ending, Long endingTimestamp, Map<String, Long> endingByTimestamp,
                Long maxMessagesPerTrigger, Long minMessagesPerTrigger, long maxTriggerDelayMs,
                Long maxBytesPerTrigger, Long minPartitions, Long maxMessagesPerPartition, long maxBytesPerPartition,
                boolean failOnDataLoss, boolean includeProperties, int fetchSize, int fetchRetries,
                long fetchRetryIntervalMs, boolean filterPushdown) implements Serializable {

        boolean consume() {
            return mode.equals("consume");
        }

        /** The durable subscription read for {@code dest} (topics only). */
        String subscriptionOf(String dest) {
            return kind(dest).equals("topic") ? subscription : null;
        }

        /** Consume mode reads (and acknowledges) the live queue, even where the destination has a log. */
        String source() {
            return consume() ? "queue" : null;
        }
    }

    /**
     * Messages per range read when {@code fetchSize} is not given: ten times the Python data source's.  An
     * answer becomes Spark columns without a pass over its rows here, so a task's time goes into round trips
     * (a 1M-row count() took 0.76 s at 10,000 and 0.35 s at 100,000 on this machine); an answer still stops
     * at 16 MiB of bodies (the broker's cap).
     */
    static final int DEFAULT_FETCH_SIZE = 100_000;

    /** Default bytes of a partition's share of a read (spec/spark.md §2, split by bytes). */
    static final long DEFAULT_PARTITION_BYTES = 64L * 1024 * 1024;

    @SuppressWarnings("unchecked")
    static Read read(Map<String, String> options, Boolean streaming) {
        Map<String, String> opts = lower(options);
        checkKnown(opts, READ_NAMES, "read");
        Connection connection = connection(opts);
        List<String> sources = new ArrayList<>();
        for (String k : List.of("queue", "topic", "destinations", "destinationpattern")) {
            if (given(opts, k)) {
                sources.add(k);
            }
        }
        if (sources.size() != 1) {
            List<String> shown = new ArrayList<>();
            for (String s : sources) {
                shown.add(spelled(s));
            }
            throw PymqException.config("give exactly one of 'queue', 'topic', 'destinations' or 'destinationPattern'"
                    + (sources.isEmpty() ? "" : " (got " + String.join(", ", shown) + ")"));
        }
        String pattern = get(opts, "destinationpattern").strip();
        pattern = pattern.isEmpty() ? null : pattern;
        String namedKind = null;
        List<String> destinations = new ArrayList<>();
        if (pattern != null) {
            new DestinationPattern(pattern);              // refused here, before any job, when malformed
        } else {
            String key = sources.get(0);
            namedKind = key.equals("queue") || key.equals("topic") ? key : null;
            for (String n : nameList(opts.get(key), spelled(key))) {
                destinations.add(destination(n, namedKind, spelled(key)));
            }
        }
        if (new TreeSet<>(destinations).size() != destinations.size()) {
            throw PymqException.config("a destination is named twice: " + String.join(", ", destinations));
        }
        String mode = get(opts, "mode").strip().toLowerCase(Locale.ROOT);
        mode = mode.isEmpty() ? "browse" : mode;
        if (!mode.equals("browse") && !mode.equals("consume")) {
            throw PymqException.config("option 'mode' must be 'browse' or 'consume', got " + pyRepr(get(opts, "mode")));
        }
        String subscription = get(opts, "subscription").strip();
        subscription = subscription.isEmpty() ? null : subscription;
        String selector = get(opts, "selector").strip();
        selector = selector.isEmpty() ? null : selector;
        if (selector != null) {
            try {
                Selector.compile(selector);
            } catch (Exception e) {
                throw PymqException.config("option 'selector' is not a valid JMS selector: " + e.getMessage());
            }
        }
        List<String> topics = new ArrayList<>();
        List<String> queues = new ArrayList<>();
        for (String d : destinations) {
            (kind(d).equals("topic") ? topics : queues).add(d);
        }
        if (pattern != null && subscription != null && !new DestinationPattern(pattern).topicsOnly()) {
            throw PymqException.config("option 'subscription' names a durable subscription of a topic; a "
                    + "'destinationPattern' used with it must start with /topic/");
        }
        if (subscription != null && !queues.isEmpty()) {
            throw PymqException.config("option 'subscription' names a durable subscription of a topic; "
                    + String.join(", ", queues) + " is a queue");
        }
        if (mode.equals("consume")) {
            if (pattern != null) {
                throw PymqException.config("mode 'consume' needs the destinations named ('queue' or 'topic'): the "
                        + "query acknowledges what it reads, so it must own each destination it consumes, not "
                        + "whatever a pattern matches later");
            }
            if (Boolean.FALSE.equals(streaming)) {
                throw PymqException.config("mode 'consume' needs a streaming query (spark.readStream): it "
                        + "acknowledges messages when Spark commits a micro-batch, and a batch read has no commit. "
                        + "Use mode 'browse' to read without removing anything");
            }
            if (!topics.isEmpty() && subscription == null) {
                throw PymqException.config("mode 'consume' on a topic needs option 'subscription': the durable "
                        + "subscription the query owns and acknowledges");
            }
            if (topics.size() > 1) {
                throw PymqException.config("mode 'consume' reads one topic per subscription; start one query per "
                        + "topic");
            }
            if (selector != null) {
                throw PymqException.config("option 'selector' cannot be used with mode 'consume': the query "
                        + "acknowledges everything up to each committed offset, so the messages a selector skips "
                        + "would be acknowledged unread. Filter in Spark, or use mode 'browse'");
            }
            for (String key : List.of("startingoffsets", "startingtimestamp", "startingoffsetsbytimestamp")) {
                if (given(opts, key)) {
                    throw PymqException.config("option '" + spelled(key) + "' cannot be used with mode 'consume': "
                            + "the query starts where the subscription was last acknowledged");
                }
            }
        }
        List<String> named = pattern != null ? null : destinations;
        Object starting = null;
        if (given(opts, "startingOffsets")) {
            starting = offsets(get(opts, "startingOffsets"), "startingOffsets", named, namedKind, true, false);
        }
        Long startingTs = optLong(opts, "startingTimestamp", 0);
        Map<String, Long> startingByTs = null;
        if (given(opts, "startingOffsetsByTimestamp")) {
            startingByTs = (Map<String, Long>) offsets(get(opts, "startingOffsetsByTimestamp"),
                    "startingOffsetsByTimestamp", named, namedKind, false, true);
        }
        oneOf(opts, "startingOffsets", "startingTimestamp", "startingOffsetsByTimestamp");
        for (String key : List.of("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")) {
            if (Boolean.TRUE.equals(streaming) && given(opts, key)) {
                throw PymqException.config("option '" + key + "' is for batch reads; a streaming query has no end "
                        + "(use Trigger.AvailableNow to stop at what exists when it starts)");
            }
        }
        oneOf(opts, "endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp");
        Object ending = "latest";
        if (given(opts, "endingOffsets")) {
            ending = offsets(get(opts, "endingOffsets"), "endingOffsets", named, namedKind, false, false);
        }
        Long endingTs = optLong(opts, "endingTimestamp", 0);
        Map<String, Long> endingByTs = null;
        if (given(opts, "endingOffsetsByTimestamp")) {
            endingByTs = (Map<String, Long>) offsets(get(opts, "endingOffsetsByTimestamp"), "endingOffsetsByTimestamp",
                    named, namedKind, false, true);
        }
        String maxKey = alias(opts, "maxMessagesPerTrigger", "maxOffsetsPerTrigger");
        String minKey = alias(opts, "minMessagesPerTrigger", "minOffsetsPerTrigger");
        Long maxMsgs = maxKey == null ? null : optLong(opts, maxKey, 1);
        Long minMsgs = minKey == null ? null : optLong(opts, minKey, 1);
        Long maxBytes = optLong(opts, "maxBytesPerTrigger", 1);
        String delayRaw = get(opts, "maxTriggerDelay").strip();
        if (!delayRaw.isEmpty() && minKey == null) {
            throw PymqException.config("option 'maxTriggerDelay' bounds how long 'minOffsetsPerTrigger' may hold a "
                    + "trigger back; give it with that option");
        }
        long delay = delayRaw.isEmpty() ? 15 * 60_000L : durationMs(delayRaw, "maxTriggerDelay");
        if (minMsgs != null && maxMsgs != null && minMsgs > maxMsgs) {
            throw PymqException.config("option '" + minKey + "' (" + minMsgs + ") is above '" + maxKey + "' ("
                    + maxMsgs + "): no micro-batch could satisfy both");
        }
        if (Boolean.FALSE.equals(streaming)) {
            for (String option : Arrays.asList(maxKey, minKey, "maxBytesPerTrigger",
                    delayRaw.isEmpty() ? null : "maxTriggerDelay")) {
                if (option != null && given(opts, option)) {
                    throw PymqException.config("option '" + option + "' is for streaming queries; a batch read takes "
                            + "everything between startingOffsets and endingOffsets");
                }
            }
        }
        return new Read(connection, List.copyOf(destinations), pattern, mode, subscription, selector, starting,
                startingTs, startingByTs, ending, endingTs, endingByTs, maxMsgs, minMsgs, delay, maxBytes,
                optLong(opts, "minPartitions", 1), optLong(opts, "maxMessagesPerPartition", 1),
                integer(opts, "maxBytesPerPartition", DEFAULT_PARTITION_BYTES, 1),
                bool(opts, "failOnDataLoss", true), bool(opts, "includeProperties", false),
                (int) Math.min(Integer.MAX_VALUE, integer(opts, "fetchSize", DEFAULT_FETCH_SIZE, 1)),
                (int) Math.min(Integer.MAX_VALUE, integer(opts, "fetchRetries", 3, 0)),
                integer(opts, "fetchRetryIntervalMs", 1_000, 0), bool(opts, "filterPushdown", false));
    }

    // -- writes ----------------------------------------------------------------------------------------

    record Write(Connection connection, String destination, boolean dedup, String dedupPrefix, int transactionSize,
                 int deliveryMode, int priority, long timeToLive, boolean arrow) implements Serializable {
    }

    static Write write(Map<String, String> options) {
        Map<String, String> opts = lower(options);
        checkKnown(opts, WRITE_NAMES, "write");
        Connection connection = connection(opts);
        List<String> found = new ArrayList<>();
        for (String k : List.of("destination", "queue", "topic")) {
            if (given(opts, k)) {
                found.add(k);
            }
        }
        if (found.size() > 1) {
            throw PymqException.config("give at most one of 'destination', 'queue' or 'topic' (got "
                    + String.join(", ", found) + ")");
        }
        String destination = null;
        if (!found.isEmpty()) {
            String key = found.get(0);
            destination = destination(get(opts, key).strip(), key.equals("destination") ? null : key, key);
        }
        String modeRaw = get(opts, "deliveryMode").strip().toLowerCase(Locale.ROOT);
        modeRaw = modeRaw.isEmpty() ? "persistent" : modeRaw;
        int mode = switch (modeRaw) {
            case "persistent", "2" -> 2;
            case "non_persistent", "non-persistent", "1" -> 1;
            default -> throw PymqException.config("option 'deliveryMode' must be 'persistent' or 'non_persistent', "
                    + "got " + pyRepr(get(opts, "deliveryMode")));
        };
        long priority = integer(opts, "priority", 4, 0);
        if (priority > 9) {
            throw PymqException.config("option 'priority' must be between 0 and 9, got " + priority);
        }
        String prefix = get(opts, "dedupPrefix").strip();
        prefix = prefix.isEmpty() ? null : prefix;
        boolean dedup = bool(opts, "dedup", false);
        if (prefix != null && !dedup) {
            throw PymqException.config("option 'dedupPrefix' only has a meaning with dedup=true");
        }
        long size = integer(opts, "transactionSize", 1000, 1);
        if (size > 100_000) {
            throw PymqException.config("option 'transactionSize' must be at most 100000 (the broker's default "
                    + "max_transaction_operations), got " + size);
        }
        return new Write(connection, destination, dedup, prefix, (int) size, mode, (int) priority,
                integer(opts, "timeToLive", 0, 0), bool(opts, "arrow", true));
    }

    /** Python's {@code difflib.get_close_matches(word, candidates, n=1)} (cutoff 0.6), enough for hints. */
    static final class Similar {
        private Similar() {
        }

        static String closest(String word, Iterable<String> candidates) {
            String best = null;
            double bestScore = 0.6;
            for (String c : candidates) {
                double s = ratio(word, c.toLowerCase(Locale.ROOT));
                if (s >= bestScore && (best == null || s > bestScore)) {
                    best = c;
                    bestScore = s;
                }
            }
            return best;
        }

        /** 2·M / T with M the matched characters of the longest common substrings, recursively. */
        static double ratio(String a, String b) {
            int total = a.length() + b.length();
            return total == 0 ? 1.0 : 2.0 * matches(a, b) / total;
        }

        private static int matches(String a, String b) {
            if (a.isEmpty() || b.isEmpty()) {
                return 0;
            }
            int bestI = 0;
            int bestJ = 0;
            int bestLen = 0;
            for (int i = 0; i < a.length(); i++) {
                for (int j = 0; j < b.length(); j++) {
                    int k = 0;
                    while (i + k < a.length() && j + k < b.length() && a.charAt(i + k) == b.charAt(j + k)) {
                        k++;
                    }
                    if (k > bestLen) {
                        bestI = i;
                        bestJ = j;
                        bestLen = k;
                    }
                }
            }
            if (bestLen == 0) {
                return 0;
            }
            return bestLen + matches(a.substring(0, bestI), b.substring(0, bestJ))
                    + matches(a.substring(bestI + bestLen), b.substring(bestJ + bestLen));
        }
    }
}
