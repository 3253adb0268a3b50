package io.pymq.jms;

import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Random;
import java.util.regex.Pattern;

/**
 * A broker URL read as a group of brokers (spec/ha.md §4.1–4.2, vectors spec/vectors/failover_urls.json):
 * ActiveMQ's {@code failover:(stomp://a:61613,stomp://b:61613)?options}, {@code failover:} without
 * parentheses, a plain comma list, or one URL (a group of one without failover).  Each member is a complete
 * single-broker URL, read by {@link PymqConnectionFactory}'s grammar; the failover options are ActiveMQ's
 * names with the defaults of spec/ha.md.  A refusal is an IllegalArgumentException whose message starts
 * with its kind in parentheses ({@code (unknown-option) ...}) and never holds a password.
 */
final class BrokerGroup implements java.io.Serializable {
    private static final long serialVersionUID = 1L;

    /** The failover options (spec/ha.md §4.2), by their URL names. */
    record Options(int initialReconnectDelay, int maxReconnectDelay, boolean useExponentialBackOff,
                   double backOffMultiplier, double jitter, int maxReconnectAttempts, int startupMaxReconnectAttempts,
                   boolean randomize, int timeout, int connectionTimeout) implements java.io.Serializable {
        static final Options DEFAULTS = new Options(100, 5000, true, 2.0, 0.2, -1, 0, false, -1, 3000);

        /**
         * How long (ms) one attempt may take to open its link (TCP, TLS, CONNECTED): {@code connectionTimeout}
         * within the connection's own {@code timeout} (0: that alone).  A stopped broker's port still accepts
         * TCP connections: without it an attempt there would wait the whole timeout before the next broker.
         */
        long attemptTimeout(long timeout) {
            return connectionTimeout <= 0 ? timeout : Math.min(timeout, connectionTimeout);
        }

        /**
         * The wait (ms, before jitter) before attempt {@code n} (from 1) after a loss: 0 for the first, then
         * the initial delay times the multiplier to the power n − 2 (or just the initial delay without
         * exponential back-off), never more than the maximum.
         */
        double delayBefore(int n) {
            if (n <= 1) {
                return 0;
            }
            double d = useExponentialBackOff ? initialReconnectDelay * Math.pow(backOffMultiplier, n - 2)
                    : initialReconnectDelay;
            return Math.min(d, maxReconnectDelay);
        }

        /** {@link #delayBefore} scaled by a uniform factor in [1 − jitter, 1 + jitter], capped again. */
        long jitteredDelayBefore(int n, Random random) {
            double d = delayBefore(n) * (1 - jitter + 2 * jitter * random.nextDouble());
            return (long) Math.min(d, maxReconnectDelay);
        }
    }

    final List<String> members;
    final Options options;
    final boolean failover;

    private BrokerGroup(List<String> members, Options options, boolean failover) {
        this.members = List.copyOf(members);
        this.options = options;
        this.failover = failover;
    }

    private static final String[] NAMES = {"initialReconnectDelay", "maxReconnectDelay", "useExponentialBackOff",
            "backOffMultiplier", "jitter", "maxReconnectAttempts", "startupMaxReconnectAttempts", "randomize", "timeout",
            "connectionTimeout"};
    private static final Pattern WHOLE = Pattern.compile("-?[0-9]+");
    private static final Pattern DECIMAL = Pattern.compile("[0-9]+(\\.[0-9]+)?");

    static IllegalArgumentException refuse(String kind, String why) {
        return new IllegalArgumentException("(" + kind + ") " + why);
    }

    /** The URL with the password of every member replaced by ***, for messages. */
    static String redacted(String url) {
        return url.replaceAll("(://[^:/@,()?]*:)[^@,()?/]*@", "$1***@");
    }

    /** Reads {@code url}; {@code single} checks one member URL (throwing IllegalArgumentException). */
    static BrokerGroup parse(String url, java.util.function.Consumer<String> single) {
        if (url == null) {
            throw refuse("empty", "the broker URL is null");
        }
        String text = url.strip();
        if (text.length() >= 9 && text.substring(0, 9).toLowerCase(Locale.ROOT).equals("failover:")) {
            String rest = text.substring(9).stripLeading();
            if (rest.startsWith("(")) {
                int close = rest.lastIndexOf(')');
                if (close < 0) {
                    throw refuse("unbalanced", "no ')' closes the broker list of " + redacted(url));
                }
                String inner = rest.substring(1, close);
                String tail = rest.substring(close + 1).strip();
                if (!tail.isEmpty() && !tail.startsWith("?")) {
                    throw refuse("unbalanced", "unexpected text after the broker list of " + redacted(url)
                            + "; failover options follow a '?'");
                }
                Options options = tail.isEmpty() ? Options.DEFAULTS : options(url, tail.substring(1));
                return new BrokerGroup(members(url, inner, single), options, true);
            }
            return new BrokerGroup(members(url, rest, single), Options.DEFAULTS, true);
        }
        if (split(text).size() > 1) {
            return new BrokerGroup(members(url, text, single), Options.DEFAULTS, true);
        }
        if (text.isEmpty()) {
            throw refuse("empty", "the broker URL is empty");
        }
        single.accept(text);
        return new BrokerGroup(List.of(text), Options.DEFAULTS, false);
    }

    /**
     * The comma-separated members of a list.  A comma inside a member's query that does not start another
     * URL (the provider's own {@code heartBeat=send,receive}) stays in that member, so a single URL with
     * that option is not a list.
     */
    static List<String> split(String list) {
        List<String> out = new ArrayList<>();
        for (String piece : list.split(",", -1)) {
            int last = out.size() - 1;
            if (last >= 0 && out.get(last).contains("?") && !piece.isBlank() && !piece.contains("://")) {
                out.set(last, out.get(last) + "," + piece);
            } else {
                out.add(piece);
            }
        }
        return out;
    }

    private static List<String> members(String url, String inner, java.util.function.Consumer<String> single) {
        if (inner.contains("(") || inner.contains(")")) {
            throw refuse("unbalanced", "parentheses inside the broker list of " + redacted(url)
                    + " (percent-encode them inside a URL)");
        }
        List<String> parts = split(inner);
        if (parts.size() == 1 && parts.get(0).isBlank()) {
            throw refuse("empty", "no broker URL in " + redacted(url));
        }
        List<String> out = new ArrayList<>();
        for (String raw : parts) {
            String part = raw.strip();
            if (part.isEmpty()) {
                throw refuse("empty", "an empty broker URL in the list of " + redacted(url));
            }
            String lower = part.toLowerCase(Locale.ROOT);
            if (lower.startsWith("failover:")) {
                throw refuse("nested-failover", "a failover URL inside the group " + redacted(url));
            }
            if (lower.startsWith("vm:")) {
                throw refuse("vm-in-group", "vm:// cannot be part of a group of brokers (" + redacted(url)
                        + "): an in-process broker has nothing to fail over to");
            }
            try {
                single.accept(part);
            } catch (IllegalArgumentException e) {
                throw refuse("bad-broker-url", "in the group " + redacted(url) + ": " + redacted(e.getMessage()));
            }
            out.add(part);
        }
        return out;
    }

    private static Options options(String url, String query) {
        Map<String, String> given = new HashMap<>();
        for (String pair : query.split("&", -1)) {
            int eq = pair.indexOf('=');
            if (eq < 0) {
                throw refuse("bad-value", "failover option \"" + decode(pair) + "\" without a value in " + redacted(url));
            }
            String key = decode(pair.substring(0, eq));
            if (!List.of(NAMES).contains(key)) {
                throw refuse("unknown-option", "unknown failover option \"" + key + "\" in " + redacted(url)
                        + "; options are " + String.join(", ", NAMES) + " (spec/ha.md section 4.2)");
            }
            if (given.put(key, decode(pair.substring(eq + 1))) != null) {
                throw refuse("duplicate-option", "failover option \"" + key + "\" given twice in " + redacted(url));
            }
        }
        Options d = Options.DEFAULTS;
        return new Options(
                whole(url, given, "initialReconnectDelay", 0, d.initialReconnectDelay()),
                whole(url, given, "maxReconnectDelay", 0, d.maxReconnectDelay()),
                bool(url, given, "useExponentialBackOff", d.useExponentialBackOff()),
                decimal(url, given, "backOffMultiplier", 1, 1000, d.backOffMultiplier()),
                decimal(url, given, "jitter", 0, 1, d.jitter()),
                whole(url, given, "maxReconnectAttempts", -1, d.maxReconnectAttempts()),
                whole(url, given, "startupMaxReconnectAttempts", -1, d.startupMaxReconnectAttempts()),
                bool(url, given, "randomize", d.randomize()),
                whole(url, given, "timeout", -1, d.timeout()),
                whole(url, given, "connectionTimeout", 0, d.connectionTimeout()));
    }

    private static String decode(String s) {
        try {
            return URLDecoder.decode(s.replace("+", "%2B"), StandardCharsets.UTF_8);
        } catch (IllegalArgumentException e) {
            throw refuse("bad-value", "bad percent-encoding in a failover option");
        }
    }

    private static int whole(String url, Map<String, String> given, String name, int min, int fallback) {
        String text = given.get(name);
        if (text == null) {
            return fallback;
        }
        if (WHOLE.matcher(text).matches() && text.length() <= 12) {
            long v = Long.parseLong(text);
            if (v >= min && v <= Integer.MAX_VALUE) {
                return (int) v;
            }
        }
        throw refuse("bad-value", name + "=\"" + text + "\" in " + redacted(url) + ": expected a whole number from "
                + min + " to " + Integer.MAX_VALUE);
    }

    private static double decimal(String url, Map<String, String> given, String name, double min, double max,
                                  double fallback) {
        String text = given.get(name);
        if (text == null) {
            return fallback;
        }
        if (DECIMAL.matcher(text).matches()) {
            double v = Double.parseDouble(text);
            if (v >= min && v <= max) {
                return v;
            }
        }
        throw refuse("bad-value", name + "=\"" + text + "\" in " + redacted(url) + ": expected a decimal number from "
                + min + " to " + max);
    }

    private static boolean bool(String url, Map<String, String> given, String name, boolean fallback) {
        String text = given.get(name);
        if (text == null) {
            return fallback;
        }
        String lower = text.toLowerCase(Locale.ROOT);
        if (lower.equals("true") || lower.equals("false")) {
            return lower.equals("true");
        }
        throw refuse("bad-value", name + "=\"" + text + "\" in " + redacted(url) + ": expected true or false");
    }
}
