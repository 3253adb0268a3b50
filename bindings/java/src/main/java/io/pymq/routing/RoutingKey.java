package io.pymq.routing;

import java.util.Map;

/**
 * Which id a destination routes its messages on (spec/routing.md §2.3; vectors: {@code key_cases} of
 * spec/vectors/group_routing.json): {@code group} (the default), {@code correlation-id} or
 * {@code message-id}.  A grouped message routes on its group whatever the setting (group order is a
 * contract; the other ids are only an affinity).  The key found is routed with {@link GroupRouter} like a
 * group id.
 */
public enum RoutingKey {
    GROUP("group"),
    CORRELATION_ID("correlation-id"),
    MESSAGE_ID("message-id");

    private final String setting;

    RoutingKey(String setting) {
        this.setting = setting;
    }

    /** The setting as the broker's configuration spells it. */
    public String setting() {
        return setting;
    }

    /** The routing key named by a setting; names are exact and lower case, anything else is refused. */
    public static RoutingKey named(String setting) {
        for (RoutingKey k : values()) {
            if (k.setting.equals(setting)) {
                return k;
            }
        }
        throw new IllegalArgumentException("unknown routing_key \"" + setting
                + "\"; expected group, correlation-id or message-id");
    }

    /** A message's key and where it came from ({@code source} is "group", "correlation-id" or "message-id"). */
    public record Key(String source, String key) {
    }

    /**
     * The key a message with these STOMP headers routes on under this setting, or null when it is unkeyed
     * (not hash-routed).  "Present" means the header exists, even with an empty value.
     */
    public Key keyOf(Map<String, String> headers) {
        String group = headers.get("JMSXGroupID");
        if (group != null) {
            return new Key("group", group);
        }
        if (this == CORRELATION_ID && headers.containsKey("correlation-id")) {
            return new Key("correlation-id", headers.get("correlation-id"));
        }
        if (this == MESSAGE_ID && headers.containsKey("message-id")) {
            return new Key("message-id", headers.get("message-id"));
        }
        return null;
    }
}
