package io.pymq.jms;

import com.fasterxml.jackson.databind.JsonNode;
import io.pymq.selector.Selector;
import io.pymq.testing.Vectors;
import jakarta.jms.InvalidSelectorException;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestFactory;

import java.math.BigInteger;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * spec/vectors/selector.json: every case evaluates to the vector's three-valued result, every bad selector
 * fails at the vector's position with its expectation (the check the provider runs before SUBSCRIBE).
 */
class SelectorVectorsTest {
    /** The vectors' language-neutral value encoding (spec/selector.md §6). */
    static Object value(JsonNode n) {
        if (n == null || n.isNull()) {
            return null;
        }
        if (n.isTextual()) {
            return n.asText();
        }
        if (n.isBoolean()) {
            return n.asBoolean();
        }
        if (n.isObject()) {
            if (n.has("$untyped")) {
                return Selector.untyped(n.get("$untyped").asText());
            }
            if (n.has("$long")) {
                BigInteger b = new BigInteger(n.get("$long").asText());
                return b.bitLength() < 64 ? (Object) b.longValue() : b;   // outside 64 bits: a value of no type
            }
            return switch (n.get("$double").asText()) {
                case "NaN" -> Double.NaN;
                case "Infinity" -> Double.POSITIVE_INFINITY;
                default -> Double.NEGATIVE_INFINITY;
            };
        }
        if (n.isIntegralNumber()) {
            return n.canConvertToLong() ? (Object) n.asLong() : n.bigIntegerValue();
        }
        return n.asDouble();
    }

    static Map<String, Object> values(JsonNode obj) {
        Map<String, Object> out = new HashMap<>();
        for (Iterator<Map.Entry<String, JsonNode>> it = obj.fields(); it.hasNext(); ) {
            Map.Entry<String, JsonNode> e = it.next();
            out.put(e.getKey(), value(e.getValue()));
        }
        return out;
    }

    @TestFactory
    List<DynamicTest> cases() {
        JsonNode v = Vectors.load("selector.json");
        Map<String, Map<String, Object>> sets = new HashMap<>();
        v.get("value_sets").fields().forEachRemaining(e -> sets.put(e.getKey(), values(e.getValue())));
        List<DynamicTest> tests = new ArrayList<>();
        int i = 0;
        for (JsonNode c : v.get("cases")) {
            String selector = c.get("selector").asText();
            Map<String, Object> vals = c.has("values_ref") ? sets.get(c.get("values_ref").asText()) : values(c.get("values"));
            String want = c.get("result").asText();
            tests.add(DynamicTest.dynamicTest(i++ + ": " + selector, () -> {
                Selector s = Selector.compile(selector);
                Boolean got = s.evaluate(vals);
                assertEquals(want, got == null ? "UNKNOWN" : got ? "TRUE" : "FALSE", selector + " with " + vals);
                assertEquals(c.get("expected").asBoolean(), s.matches(vals));
            }));
        }
        assertTrue(tests.size() > 300);
        return tests;
    }

    @TestFactory
    List<DynamicTest> badSelectors() {
        JsonNode v = Vectors.load("selector.json");
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode c : v.get("bad_selectors")) {
            String selector = c.get("selector").asText();
            tests.add(DynamicTest.dynamicTest(selector, () -> {
                Object[] err = Selector.error(selector);
                assertNotNull(err, "should not compile: " + selector);
                assertArrayEquals(new Object[] {c.get("position").asInt(), c.get("expected").asText()}, err, selector);
                InvalidSelectorException e = assertThrows(InvalidSelectorException.class, () -> Selector.check(selector));
                assertTrue(e.getMessage().startsWith("selector error at position " + c.get("position").asInt()));
            }));
        }
        return tests;
    }

    /** What an untyped header's text reads as (spec/selector.md section 3): the one grammar, in the vectors. */
    @TestFactory
    List<DynamicTest> untypedReads() {
        JsonNode v = Vectors.load("selector.json");
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode r : v.get("untyped_reads")) {
            String text = r.get("text").asText();
            Object want = value(r.get("number"));
            tests.add(DynamicTest.dynamicTest("read " + text, () -> {
                Object got = Selector.readNumber(text);
                assertEquals(want, got, text);
                Object u = Selector.untyped(text);
                if (want == null) {
                    assertEquals(text, u);
                } else {
                    assertEquals(new Selector.Untyped(text, want), u);
                }
            }));
        }
        assertTrue(tests.size() > 30);
        return tests;
    }

    @Test
    void likeIsLinearNotExponential() throws Exception {
        Selector s = Selector.compile("x LIKE '%a%a%a%a%a%a%a%a%a%a%a%a%b'");
        assertEquals(Boolean.FALSE, s.evaluate(Map.of("x", "a".repeat(5000))));
        assertEquals(Boolean.TRUE, Selector.compile("x LIKE '%\uD834\uDD1E_'").evaluate(Map.of("x", "z\uD834\uDD1Ey")));
    }
}
