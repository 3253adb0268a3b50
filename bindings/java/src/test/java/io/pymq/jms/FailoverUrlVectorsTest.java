package io.pymq.jms;

import com.fasterxml.jackson.databind.JsonNode;
import io.pymq.testing.Vectors;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

import java.util.ArrayList;
import java.util.List;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** spec/vectors/failover_urls.json: the failover URL grammar, its refusals and the back-off (spec/ha.md §4.1-4.2). */
class FailoverUrlVectorsTest {
    @TestFactory
    List<DynamicTest> failoverUrls() {
        JsonNode v = Vectors.load("failover_urls.json");
        List<DynamicTest> tests = new ArrayList<>();
        for (JsonNode c : v.get("parse")) {
            tests.add(DynamicTest.dynamicTest("parse: " + c.get("name").asText(), () -> parse(c)));
        }
        for (JsonNode c : v.get("refuse")) {
            tests.add(DynamicTest.dynamicTest("refuse: " + c.get("name").asText(), () -> {
                String url = c.get("url").asText();
                IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
                        () -> new PymqConnectionFactory(url));
                assertTrue(e.getMessage().startsWith("(" + c.get("error").asText() + ")"), e.getMessage());
                assertFalse(e.getMessage().contains("s3cret"), "a refusal never shows a password");
            }));
        }
        for (JsonNode c : v.get("delays")) {
            tests.add(DynamicTest.dynamicTest("delays: " + c.get("name").asText(), () -> {
                BrokerGroup.Options o = new PymqConnectionFactory(c.get("url").asText()).failoverOptions();
                JsonNode want = c.get("delays_ms");
                for (int n = 1; n <= want.size(); n++) {
                    assertEquals(want.get(n - 1).asDouble(), o.delayBefore(n), 1e-9, "attempt " + n);
                    double w = want.get(n - 1).asDouble();
                    java.util.Random r = new java.util.Random(n);
                    long jittered = o.jitteredDelayBefore(n, r);
                    assertTrue(jittered >= Math.floor(w * (1 - o.jitter())) - 1
                            && jittered <= Math.min(o.maxReconnectDelay(), w * (1 + o.jitter())), "jitter " + jittered);
                }
            }));
        }
        for (JsonNode c : v.get("vhosts")) {
            tests.add(DynamicTest.dynamicTest("vhosts: " + c.get("name").asText(), () -> {
                PymqConnectionFactory f = new PymqConnectionFactory(c.get("url").asText());
                if (!c.get("vhost").isNull()) {
                    f.setVhost(c.get("vhost").asText());
                }
                List<PymqConnectionFactory.Member> got = f.urlMembers();
                JsonNode want = c.get("members");
                assertEquals(want.size(), got.size());
                for (int i = 0; i < want.size(); i++) {
                    JsonNode w = want.get(i);
                    PymqConnectionFactory.Member m = got.get(i);
                    assertEquals(w.get("host").asText(), m.endpoint().host());
                    assertEquals(w.get("port").asInt(), m.endpoint().port());
                    assertEquals(w.get("vhost").isNull() ? null : w.get("vhost").asText(), f.vhostAt(m), "member " + i);
                }
                assertEquals(f.vhostAt(got.get(0)), f.vhostAt(f.brokers().get(0)), "the first broker");
            }));
        }
        return tests;
    }

    private static void parse(JsonNode c) {
        PymqConnectionFactory f = new PymqConnectionFactory(c.get("url").asText());
        assertEquals(c.get("failover").asBoolean(), f.failover());
        List<PymqConnectionFactory.Member> got = f.urlMembers();
        JsonNode want = c.get("brokers");
        assertEquals(want.size(), got.size());
        for (int i = 0; i < want.size(); i++) {
            JsonNode w = want.get(i);
            PymqConnectionFactory.Member m = got.get(i);
            assertEquals(w.get("host").asText(), m.endpoint().host());
            assertEquals(w.get("port").asInt(), m.endpoint().port());
            assertEquals(w.get("tls").asBoolean(), m.endpoint().tls());
            assertEquals(w.get("username").isNull() ? null : w.get("username").asText(), m.user());
            assertEquals(w.get("password").isNull() ? null : w.get("password").asText(), m.password());
        }
        JsonNode o = c.get("options");
        BrokerGroup.Options opts = f.failoverOptions();
        assertEquals(o.get("initialReconnectDelay").asInt(), opts.initialReconnectDelay());
        assertEquals(o.get("maxReconnectDelay").asInt(), opts.maxReconnectDelay());
        assertEquals(o.get("useExponentialBackOff").asBoolean(), opts.useExponentialBackOff());
        assertEquals(o.get("backOffMultiplier").asDouble(), opts.backOffMultiplier());
        assertEquals(o.get("jitter").asDouble(), opts.jitter());
        assertEquals(o.get("maxReconnectAttempts").asInt(), opts.maxReconnectAttempts());
        assertEquals(o.get("startupMaxReconnectAttempts").asInt(), opts.startupMaxReconnectAttempts());
        assertEquals(o.get("randomize").asBoolean(), opts.randomize());
        assertEquals(o.get("timeout").asInt(), opts.timeout());
        assertEquals(o.get("connectionTimeout").asInt(), opts.connectionTimeout());
    }
}
