package io.pymq.jms;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import com.fasterxml.jackson.core.json.JsonReadFeature;
import com.fasterxml.jackson.core.json.JsonWriteFeature;
import io.pymq.stomp.Frame;
import io.pymq.stomp.Header;
import jakarta.jms.DeliveryMode;
import jakarta.jms.JMSException;
import jakarta.jms.Message;
import jakarta.jms.MessageFormatException;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.ByteBuffer;
import java.nio.charset.CharacterCodingException;
import java.nio.charset.Charset;
import java.nio.charset.CodingErrorAction;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Base64;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;

/**
 * JMS messages to and from STOMP frames, exactly as the Python SDK writes and reads them
 * ({@code pymq/message.py}; spec/stomp.md §4 and §7; vectors spec/vectors/messages.json).
 *
 * <p>SEND headers: {@code content-type}, {@code persistent}, {@code priority} (when not 4), {@code expires}
 * (absolute ms, when set), {@code timestamp}, {@code correlation-id}, {@code reply-to}, {@code type}, then
 * every property as a header with {@code pymq-types: name=i|f|b,...} naming the typed ones.
 * MESSAGE frames: the body kind from {@code content-type}; the JMS fields from their headers (a number that
 * does not parse falls back to the default); every other header is a property, typed by {@code pymq-types}
 * (a typed value that does not parse stays a string).
 */
final class WireFormat {
    static final String TEXT_TYPE = "text/plain;charset=utf-8";
    static final String BYTES_TYPE = "application/octet-stream";
    static final String MAP_TYPE = "application/x-pymq-map+json";

    private static final JsonFactory JSON = JsonFactory.builder()
            .enable(JsonReadFeature.ALLOW_NON_NUMERIC_NUMBERS)     // Python's json writes NaN and Infinity bare
            .disable(JsonWriteFeature.WRITE_NAN_AS_STRINGS)        // ... and so does this side, for Python to read
            .build();

    private WireFormat() {
    }

    // -- SEND -------------------------------------------------------------------------------------------
    /** The SEND headers of {@code m} (destination and transport headers excluded). */
    static List<Header> sendHeaders(PymqMessage m) {
        List<Header> h = new ArrayList<>(8 + m.properties.size());
        h.add(new Header("content-type", m.contentType()));
        h.add(new Header("persistent", m.deliveryMode == DeliveryMode.NON_PERSISTENT ? "false" : "true"));
        if (m.priority != Message.DEFAULT_PRIORITY) {
            h.add(new Header("priority", Integer.toString(m.priority)));
        }
        if (m.expiration != 0) {
            h.add(new Header("expires", Long.toString(m.expiration)));
        }
        if (m.timestamp != 0) {
            h.add(new Header("timestamp", Long.toString(m.timestamp)));
        }
        if (m.correlationId != null) {
            h.add(new Header("correlation-id", m.correlationId));
        }
        if (m.replyTo instanceof PymqDestination d) {
            h.add(new Header("reply-to", d.stompName()));
        }
        if (m.type != null) {
            h.add(new Header("type", m.type));
        }
        StringBuilder types = new StringBuilder();
        StringBuilder jmsTypes = new StringBuilder();
        for (Map.Entry<String, Object> p : m.properties.entrySet()) {
            Object v = p.getValue();
            h.add(new Header(p.getKey(), propertyText(v)));
            append(types, p.getKey(), typeCode(v));
            append(jmsTypes, p.getKey(), jmsTypeCode(v));
        }
        if (!m.properties.isEmpty()) {
            // even empty: a message with pymq-types is typed, so the broker's selectors keep its strings strings
            // (a plain header without it compares as a number when it reads as one: spec/selector.md section 3)
            h.add(new Header("pymq-types", types.toString()));
        }
        if (m instanceof PymqMapMessage map) {
            String entries = map.entryJmsTypes();
            if (!entries.isEmpty()) {
                jmsTypes.append(jmsTypes.length() > 0 ? "," : "").append(entries);
            }
        }
        if (jmsTypes.length() > 0) {
            h.add(new Header(JMS_TYPES, jmsTypes.toString()));
        }
        return h;
    }

    /**
     * In {@code pymq-jms-types}, an item naming a MapMessage entry rather than a property starts with this
     * (spec/stomp.md section 7): no property name does (a STOMP header name has no bare ':').
     */
    static final String MAP_ENTRY = ":";

    /** The JMS type of a map entry narrower than its JSON value: those of properties, and {@code char}. */
    static String entryJmsTypeCode(Object v) {
        return v instanceof Character ? "char" : jmsTypeCode(v);
    }

    /** The map entries' narrowing items of a {@code pymq-jms-types} header ({@code :name} to type). */
    static Map<String, String> entryJmsTypes(String header) {
        Map<String, String> out = new HashMap<>();
        if (header != null) {
            for (String item : header.split(",", -1)) {
                int eq = item.lastIndexOf('=');
                if (item.startsWith(MAP_ENTRY) && eq > MAP_ENTRY.length()) {
                    out.put(item.substring(MAP_ENTRY.length(), eq), item.substring(eq + 1));
                }
            }
        }
        return out;
    }

    private static void append(StringBuilder list, String name, String code) {
        if (code != null) {
            if (list.length() > 0) {
                list.append(',');
            }
            list.append(name).append('=').append(code);
        }
    }

    /**
     * The header naming the JMS type of each property narrower than its {@code pymq-types} code
     * (spec/stomp.md §7): {@code int}, {@code short}, {@code byte} for an {@code i}, {@code float} for an
     * {@code f}.  The other SDKs skip it (their integers and reals are 64-bit); it lets a Java receiver
     * give back the type that was set, as JMS requires of getObjectProperty.
     */
    static final String JMS_TYPES = "pymq-jms-types";

    static String jmsTypeCode(Object v) {
        if (v instanceof Integer) {
            return "int";
        }
        if (v instanceof Short) {
            return "short";
        }
        if (v instanceof Byte) {
            return "byte";
        }
        return v instanceof Float ? "float" : null;
    }

    /**
     * {@code value} (typed by pymq-types) as the JMS type {@code code} names, when it is that kind of value
     * and fits; else unchanged (a foreign or altered header never turns into a wrong value).
     */
    static Object narrowed(Object value, String code, String text) {
        if (value instanceof Long l) {
            switch (code) {
                case "int" -> {
                    return l == l.intValue() ? (Object) l.intValue() : value;
                }
                case "short" -> {
                    return l == l.shortValue() ? (Object) l.shortValue() : value;
                }
                case "byte" -> {
                    return l == l.byteValue() ? (Object) l.byteValue() : value;
                }
                default -> {
                    return value;
                }
            }
        }
        if (value instanceof Double d && code.equals("float")) {
            try {
                // the sender wrote Float.toString: read as a float it is the float that was set
                float exact = Float.parseFloat(text.strip());
                if (Float.isInfinite(exact) == d.isInfinite() && Float.isNaN(exact) == d.isNaN()
                        && (exact != 0f || d == 0.0)) {
                    return exact;
                }
            } catch (NumberFormatException e) {
                // not a float's text: the double stands
            }
        }
        return value;
    }

    static String typeCode(Object v) {
        if (v instanceof Boolean) {
            return "b";
        }
        if (v instanceof Byte || v instanceof Short || v instanceof Integer || v instanceof Long) {
            return "i";
        }
        if (v instanceof Float || v instanceof Double) {
            return "f";
        }
        return null;
    }

    /** A property value as text: floats with the shortest text that reads back to the same value. */
    static String propertyText(Object v) {
        if (v instanceof Float f) {
            return Float.toString(f);
        }
        if (v instanceof Double d) {
            return Double.toString(d);
        }
        return String.valueOf(v);
    }

    // -- MESSAGE ----------------------------------------------------------------------------------------
    /** The message a MESSAGE frame carries (not yet marked received: the session does that). */
    static PymqMessage fromFrame(Frame f) {
        Map<String, String> h = f.headerMap();
        String ctype = h.getOrDefault("content-type", "");
        String base = ctype.split(";", 2)[0].strip().toLowerCase(Locale.ROOT);
        byte[] body = f.body();
        PymqMessage m;
        if (base.equals(MAP_TYPE) || "jms-map-json".equals(h.get("transformation"))) {
            m = new PymqMapMessage(body, h.get(JMS_TYPES));
        } else if (base.startsWith("text/") || base.equals("application/json") || base.equals("application/xml")) {
            m = new PymqTextMessage(new String(body, charset(ctype)));
        } else if (!base.isEmpty()) {
            m = new PymqBytesMessage(body);
        } else {
            String text = strictUtf8(body);
            m = text != null ? new PymqTextMessage(text) : new PymqBytesMessage(body);
        }
        m.messageId = h.get("message-id");
        m.destination = PymqDestination.fromStompName(h.get("destination"));
        m.deliveryMode = "false".equals(h.getOrDefault("persistent", "true").toLowerCase(Locale.ROOT))
                ? DeliveryMode.NON_PERSISTENT : DeliveryMode.PERSISTENT;
        m.priority = (int) pyInt(h.get("priority"), Message.DEFAULT_PRIORITY);
        m.timestamp = pyInt(h.get("timestamp"), 0);
        m.expiration = pyInt(h.get("expires"), 0);
        m.correlationId = h.get("correlation-id");
        m.replyTo = PymqDestination.fromStompName(h.get("reply-to"));
        m.type = h.get("type");
        m.redelivered = "true".equals(h.getOrDefault("redelivered", "false").toLowerCase(Locale.ROOT));
        String seq = h.get("pymq-seq");
        if (seq != null && !seq.isEmpty() && seq.length() <= 18 && seq.chars().allMatch(c -> c >= '0' && c <= '9')) {
            m.sequence = Long.parseLong(seq);
        }
        Map<String, String> types = new HashMap<>();
        String spec = h.get("pymq-types");
        if (spec != null && !spec.isEmpty()) {
            for (String item : spec.split(",", -1)) {
                int eq = item.lastIndexOf('=');
                types.put(eq < 0 ? "" : item.substring(0, eq), eq < 0 ? item : item.substring(eq + 1));
            }
        }
        for (Map.Entry<String, String> e : h.entrySet()) {
            String name = e.getKey();
            if (PymqMessage.RESERVED.contains(name)) {
                continue;
            }
            String code = types.get(name);
            m.properties.put(name, code == null || code.isEmpty() ? e.getValue() : typed(e.getValue(), code));
        }
        String narrow = h.get(JMS_TYPES);
        if (narrow != null && !narrow.isEmpty()) {
            for (String item : narrow.split(",", -1)) {
                int eq = item.lastIndexOf('=');
                String name = eq < 0 ? "" : item.substring(0, eq);
                Object v = m.properties.get(name);
                if (eq > 0 && v != null && types.containsKey(name)) {
                    m.properties.put(name, narrowed(v, item.substring(eq + 1), h.get(name)));
                }
            }
        }
        Object count = m.properties.get("JMSXDeliveryCount");
        if (count != null) {
            m.deliveryCount = (int) anyInt(count, 1);
            m.properties.put("JMSXDeliveryCount", (long) m.deliveryCount);
        }
        Object groupSeq = m.properties.get("JMSXGroupSeq");
        if (groupSeq instanceof String s) {
            m.properties.put("JMSXGroupSeq", pyInt(s, 0));
        }
        // JMSDeliveryTime: pymq consumes the producer's scheduling headers and says pymq-delivery-time
        // (spec/stomp.md §4); the scheduling headers are read for brokers that keep them
        long at = pyInt(h.get("pymq-delivery-time"), 0);
        if (at == 0) {
            at = pyInt(h.get("AMQ_SCHEDULED_TIME"), 0);
        }
        long delay = pyInt(h.get("AMQ_SCHEDULED_DELAY"), 0);
        m.deliveryTime = at != 0 ? at : m.timestamp + Math.max(0, delay);
        return m;
    }

    private static long anyInt(Object v, long fallback) {
        if (v instanceof Long l) {
            return l;
        }
        return v instanceof String s ? pyInt(s, fallback) : fallback;
    }

    private static Object typed(String value, String code) {
        switch (code) {
            case "i" -> {
                Long v = parseIntLike(value);
                return v != null ? (Object) v : value;
            }
            case "f" -> {
                Double v = parseFloatLike(value);
                return v != null ? (Object) v : value;
            }
            case "b" -> {
                return value.equals("true");
            }
            default -> {
                return value;
            }
        }
    }

    /**
     * Python's {@code int(text)} for what can reach Java: surrounding whitespace, a sign, ASCII digits
     * (with single underscores between them); null for anything else or a value beyond 64 bits.
     */
    static Long parseIntLike(String text) {
        String s = text.strip();
        if (s.contains("_")) {
            if (s.contains("__") || s.endsWith("_") || s.startsWith("_") || s.startsWith("+_") || s.startsWith("-_")) {
                return null;
            }
            s = s.replace("_", "");
        }
        int i = s.startsWith("+") || s.startsWith("-") ? 1 : 0;
        if (s.length() == i || !s.substring(i).chars().allMatch(c -> c >= '0' && c <= '9')) {
            return null;
        }
        try {
            return Long.parseLong(s.startsWith("+") ? s.substring(1) : s);
        } catch (NumberFormatException e) {
            return null;
        }
    }

    private static Double parseFloatLike(String text) {
        String s = text.strip();
        String lower = s.toLowerCase(Locale.ROOT);
        String unsigned = lower.startsWith("+") || lower.startsWith("-") ? lower.substring(1) : lower;
        if (unsigned.equals("inf") || unsigned.equals("infinity")) {
            return lower.startsWith("-") ? Double.NEGATIVE_INFINITY : Double.POSITIVE_INFINITY;
        }
        if (unsigned.equals("nan")) {
            return Double.NaN;
        }
        // Java's parser accepts hexadecimal floats and 'd'/'f' suffixes, which Python's float() refuses
        if (unsigned.isEmpty() || unsigned.startsWith("0x") || !unsigned.chars().allMatch(c -> (c >= '0' && c <= '9')
                || c == '.' || c == 'e' || c == '+' || c == '-')) {
            return null;
        }
        try {
            return Double.parseDouble(s);
        } catch (NumberFormatException e) {
            return null;
        }
    }

    private static long pyInt(String text, long fallback) {
        if (text == null) {
            return fallback;
        }
        Long v = parseIntLike(text);
        return v == null ? fallback : v;
    }

    private static final Map<String, Charset> CHARSET_ALIASES = Map.of(
            "latin-1", StandardCharsets.ISO_8859_1, "latin1", StandardCharsets.ISO_8859_1,
            "utf8", StandardCharsets.UTF_8, "ascii", StandardCharsets.US_ASCII);

    /** The content-type's charset (UTF-8 unless it names another one Java knows). */
    static Charset charset(String contentType) {
        String[] parts = contentType.split(";");
        String name = null;
        for (int i = 1; i < parts.length; i++) {
            String part = parts[i].strip();
            int eq = part.indexOf('=');
            if (eq > 0 && part.substring(0, eq).equalsIgnoreCase("charset") && eq + 1 < part.length()) {
                name = part.substring(eq + 1).replace("\"", "");
            }
        }
        if (name == null) {
            return StandardCharsets.UTF_8;
        }
        Charset alias = CHARSET_ALIASES.get(name.toLowerCase(Locale.ROOT));
        if (alias != null) {
            return alias;
        }
        try {
            return Charset.forName(name);
        } catch (IllegalArgumentException e) {
            return StandardCharsets.UTF_8;
        }
    }

    /** The body as text when it is valid UTF-8, else null. */
    static String strictUtf8(byte[] body) {
        try {
            return StandardCharsets.UTF_8.newDecoder()
                    .onMalformedInput(CodingErrorAction.REPORT)
                    .onUnmappableCharacter(CodingErrorAction.REPORT)
                    .decode(ByteBuffer.wrap(body)).toString();
        } catch (CharacterCodingException e) {
            return null;
        }
    }

    // -- map bodies -------------------------------------------------------------------------------------
    static byte[] encodeMap(Map<String, Object> map) throws JMSException {
        ByteArrayOutputStream out = new ByteArrayOutputStream();
        try (JsonGenerator g = JSON.createGenerator(out)) {
            g.writeStartObject();
            for (Map.Entry<String, Object> e : map.entrySet()) {
                g.writeFieldName(e.getKey());
                Object v = e.getValue();
                if (v == null) {
                    g.writeNull();
                } else if (v instanceof String s) {
                    g.writeString(s);
                } else if (v instanceof Character c) {
                    g.writeString(String.valueOf(c));
                } else if (v instanceof Boolean b) {
                    g.writeBoolean(b);
                } else if (v instanceof Float f) {
                    g.writeNumber(f);
                } else if (v instanceof Double d) {
                    g.writeNumber(d);
                } else if (v instanceof Number n) {
                    g.writeNumber(n.longValue());
                } else if (v instanceof byte[] b) {
                    g.writeStartObject();
                    g.writeStringField("$bytes", Base64.getEncoder().encodeToString(b));
                    g.writeEndObject();
                } else {
                    throw new MessageFormatException("map value " + e.getKey() + " has no JSON form: " + v.getClass());
                }
            }
            g.writeEndObject();
        } catch (IOException e) {
            JMSException j = new MessageFormatException("cannot encode the map body: " + e.getMessage());
            j.setLinkedException(e);
            throw j;
        }
        return out.toByteArray();
    }

    static Map<String, Object> decodeMap(byte[] body) throws JMSException {
        return decodeMap(body, Map.of());
    }

    /**
     * The map of a MapMessage body; {@code narrow} (entry name to JMS type, from {@code pymq-jms-types})
     * gives an entry back as the type that was set (Integer, Short, Byte, Float, Character) when its JSON
     * value is that kind of value and fits; else it stays Long, Double or String.
     */
    static Map<String, Object> decodeMap(byte[] body, Map<String, String> narrow) throws JMSException {
        Map<String, Object> out = new LinkedHashMap<>();
        if (body.length == 0) {
            return out;
        }
        try (JsonParser p = JSON.createParser(body)) {
            if (p.nextToken() != JsonToken.START_OBJECT) {
                throw new MessageFormatException("map message body is not a JSON object");
            }
            while (p.nextToken() == JsonToken.FIELD_NAME) {
                String name = p.currentName();
                JsonToken t = p.nextToken();
                out.put(name, switch (t) {
                    case VALUE_STRING -> "char".equals(narrow.get(name)) && p.getText().length() == 1
                            ? (Object) p.getText().charAt(0) : p.getText();
                    case VALUE_TRUE -> Boolean.TRUE;
                    case VALUE_FALSE -> Boolean.FALSE;
                    case VALUE_NULL -> null;
                    case VALUE_NUMBER_INT -> {
                        if (p.getNumberType() == JsonParser.NumberType.BIG_INTEGER) {
                            throw new MessageFormatException("map value " + name + ": integer " + p.getText()
                                    + " does not fit in a long");
                        }
                        yield narrowed(p.getLongValue(), narrow.getOrDefault(name, ""), p.getText());
                    }
                    case VALUE_NUMBER_FLOAT -> narrowed(p.getDoubleValue(), narrow.getOrDefault(name, ""), p.getText());
                    case START_OBJECT -> bytesValue(p, name);
                    default -> throw new MessageFormatException("map value " + name + " is a JSON " + t
                            + ", not a scalar or {\"$bytes\": ...}");
                });
            }
            if (p.currentToken() != JsonToken.END_OBJECT || p.nextToken() != null) {
                throw new MessageFormatException("map message body has text after its JSON object");
            }
        } catch (IOException e) {
            JMSException j = new MessageFormatException("map message body is not valid JSON: " + e.getMessage());
            j.setLinkedException(e);
            throw j;
        }
        return out;
    }

    private static byte[] bytesValue(JsonParser p, String name) throws IOException, JMSException {
        byte[] value = null;
        while (p.nextToken() == JsonToken.FIELD_NAME) {
            String field = p.currentName();
            JsonToken t = p.nextToken();
            if (field.equals("$bytes") && t == JsonToken.VALUE_STRING) {
                try {
                    value = Base64.getDecoder().decode(p.getText());
                } catch (IllegalArgumentException e) {
                    throw new MessageFormatException("map value " + name + ": $bytes is not base64");
                }
            } else {
                throw new MessageFormatException("map value " + name + " is an object other than {\"$bytes\": ...}");
            }
        }
        if (value == null) {
            throw new MessageFormatException("map value " + name + " is an object other than {\"$bytes\": ...}");
        }
        return value;
    }
}
