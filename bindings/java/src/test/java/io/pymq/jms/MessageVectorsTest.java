package io.pymq.jms;

import com.fasterxml.jackson.databind.JsonNode;
import io.pymq.stomp.Frame;
import io.pymq.stomp.Header;
import io.pymq.testing.Vectors;
import jakarta.jms.DeliveryMode;
import jakarta.jms.JMSException;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

import java.util.ArrayList;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNull;

/** spec/vectors/messages.json: MESSAGE frames decode as the Python SDK's from_frame decodes them. */
class MessageVectorsTest {
    static String typeName(Object v) {
        if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
            return "int";
        }
        if (v instanceof Double || v instanceof Float) {
            return "float";
        }
        if (v instanceof Boolean) {
            return "bool";
        }
        return v instanceof String ? "string" : "?" + v.getClass();
    }

    /** A decoded value as the vectors' JSON holds it (numbers compared as doubles, bytes as $bytes). */
    static Object view(Object v) {
        if (v instanceof Long || v instanceof Integer || v instanceof Short || v instanceof Byte) {
            return ((Number) v).doubleValue();
        }
        if (v instanceof Float f) {
            return Double.parseDouble(Float.toString(f));   // the decimal the sender wrote, as Python reads it
        }
        if (v instanceof byte[] b) {
            return Map.of("$bytes", Base64.getEncoder().encodeToString(b));
        }
        return v;
    }

    static Object json(JsonNode n) {
        if (n.isNull()) {
            return null;
        }
        if (n.isNumber()) {
            return n.asDouble();
        }
        if (n.isBoolean()) {
            return n.asBoolean();
        }
        if (n.isObject()) {
            Map<String, Object> m = new LinkedHashMap<>();
            n.fields().forEachRemaining(e -> m.put(e.getKey(), json(e.getValue())));
            return m;
        }
        return n.asText();
    }

    static String text(JsonNode n) {
        return n == null || n.isNull() ? null : n.asText();
    }

    @TestFactory
    List<DynamicTest> messageVectors() {
        JsonNode v = Vectors.load("messages.json");
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode c : v.get("cases")) {
            tests.add(DynamicTest.dynamicTest(c.get("name").asText(), () -> check(c)));
        }
        return tests;
    }

    private static void check(JsonNode c) throws JMSException {
        List<Header> headers = new ArrayList<>();
        java.util.Set<String> seen = new java.util.HashSet<>();
        for (JsonNode h : c.get("headers")) {
            if (seen.add(h.get(0).asText())) {   // first wins, as the scanner hands them over
                headers.add(new Header(h.get(0).asText(), h.get(1).asText()));
            }
        }
        PymqMessage m = WireFormat.fromFrame(new Frame("MESSAGE", headers, Vectors.hex(c.get("body_hex").asText())));
        JsonNode e = c.get("expect");
        switch (e.get("kind").asText()) {
            case "text" -> assertEquals(e.get("text").asText(), assertInstanceOf(PymqTextMessage.class, m).getText());
            case "bytes" -> {
                PymqBytesMessage b = assertInstanceOf(PymqBytesMessage.class, m);
                assertEquals(e.get("bytes_hex").asText(), Vectors.hex(b.bodyBytes()));
            }
            default -> {
                PymqMapMessage map = assertInstanceOf(PymqMapMessage.class, m);
                Map<String, Object> got = new LinkedHashMap<>();
                map.map().forEach((k, val) -> got.put(k, view(val)));
                assertEquals(json(e.get("map")), got);
            }
        }
        assertEquals(text(e.get("message_id")), m.getJMSMessageID());
        assertEquals(text(e.get("destination")), m.destination == null ? null : ((PymqDestination) m.destination).stompName());
        assertEquals(e.get("persistent").asBoolean(), m.getJMSDeliveryMode() == DeliveryMode.PERSISTENT);
        assertEquals(e.get("priority").asInt(), m.getJMSPriority());
        assertEquals(e.get("timestamp").asLong(), m.getJMSTimestamp());
        assertEquals(e.get("expires").asLong(), m.getJMSExpiration());
        assertEquals(text(e.get("correlation_id")), m.getJMSCorrelationID());
        assertEquals(text(e.get("reply_to")), m.replyTo == null ? null : ((PymqDestination) m.replyTo).stompName());
        assertEquals(text(e.get("type")), m.getJMSType());
        assertEquals(e.get("redelivered").asBoolean(), m.getJMSRedelivered());
        assertEquals(e.get("delivery_count").asInt(), m.deliveryCount);
        if (e.get("sequence").isNull()) {
            assertNull(m.getSequence());
        } else {
            assertEquals(e.get("sequence").asLong(), m.getSequence());
        }
        assertEquals(text(e.get("group_id")), m.getStringProperty("JMSXGroupID"));
        Map<String, List<Object>> want = new LinkedHashMap<>();
        e.get("properties").fields().forEachRemaining(p ->
                want.put(p.getKey(), List.of(p.getValue().get("type").asText(), json(p.getValue().get("value")))));
        Map<String, List<Object>> got = new LinkedHashMap<>();
        m.properties().forEach((k, val) -> got.put(k, List.of(typeName(val), view(val))));
        assertEquals(want, got);
        // the Java class of each property: a case's expect_jms, else what every integer and real becomes
        Map<String, String> classes = new LinkedHashMap<>();
        Map<String, String> wantClasses = new LinkedHashMap<>();
        JsonNode jms = c.get("expect_jms");
        m.properties().forEach((k, val) -> {
            classes.put(k, val.getClass().getSimpleName());
            String t = want.get(k).get(0).toString();
            wantClasses.put(k, jms != null && jms.has(k) ? jms.get(k).asText()
                    : t.equals("int") ? "Long" : t.equals("float") ? "Double" : t.equals("bool") ? "Boolean" : "String");
        });
        if (m.properties().containsKey("JMSXDeliveryCount")) {
            wantClasses.put("JMSXDeliveryCount", "Long");    // an Integer once the session hands the message over
        }
        assertEquals(wantClasses, classes);
    }
}
