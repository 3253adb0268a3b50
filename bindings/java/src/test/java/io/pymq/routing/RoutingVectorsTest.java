package io.pymq.routing;

import com.fasterxml.jackson.databind.JsonNode;
import io.pymq.testing.Vectors;
import org.junit.jupiter.api.Test;

import java.nio.ByteBuffer;
import java.nio.ByteOrder;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** spec/vectors/murmur3.json and group_routing.json (spec/routing.md §1 and §2). */
class RoutingVectorsTest {
    private static List<String> strings(JsonNode array) {
        List<String> out = new ArrayList<>();
        array.forEach(n -> out.add(n.asText()));
        return out;
    }

    @Test
    void murmur3Vectors() {
        JsonNode v = Vectors.load("murmur3.json");
        int n = 0;
        for (JsonNode c : v.get("vectors")) {
            byte[] input = Vectors.hex(c.get("input_hex").asText());
            assertEquals(c.get("hash").asLong(), Murmur3.hash(input, c.get("seed").asLong()), c.toString());
            n++;
        }
        assertTrue(n > 20);
    }

    /** SMHasher's self-test: hash keys 0..255 bytes long with seed 256-i, then the hash of those hashes. */
    @Test
    void smhasherVerification() {
        JsonNode v = Vectors.load("murmur3.json");
        byte[] key = new byte[256];
        ByteBuffer results = ByteBuffer.allocate(1024).order(ByteOrder.LITTLE_ENDIAN);
        for (int i = 0; i < 256; i++) {
            key[i] = (byte) i;
            byte[] prefix = new byte[i];
            System.arraycopy(key, 0, prefix, 0, i);
            results.putInt(Murmur3.hash32(prefix, 256 - i));
        }
        long got = Murmur3.hash(results.array(), 0);
        assertEquals(0xb0f57ee3L, got);
        assertEquals(v.get("verification").get("expected").asLong(), got);
    }

    @Test
    void groupRoutingVectors() {
        JsonNode v = Vectors.load("group_routing.json");
        for (JsonNode c : v.get("cases")) {
            String name = c.get("name").asText();
            String key = c.get("key").asText();
            List<String> destinations = strings(c.get("destinations"));
            assertEquals(c.get("key_hex").asText(), Vectors.hex(key.getBytes(java.nio.charset.StandardCharsets.UTF_8)), name);
            GroupRouter rendezvous = new GroupRouter(destinations, GroupRouter.Strategy.RENDEZVOUS);
            GroupRouter modulo = new GroupRouter(destinations, GroupRouter.Strategy.named("modulo"));
            assertEquals(strings(c.get("sorted")), rendezvous.destinations(), name);
            List<Long> hashes = new ArrayList<>();
            for (String d : rendezvous.destinations()) {
                hashes.add(Murmur3.groupHash(d));
            }
            List<Long> want = new ArrayList<>();
            c.get("destination_hashes").forEach(h -> want.add(h.asLong()));
            assertEquals(want, hashes, name);
            assertEquals(c.get("group_hash").asLong(), Murmur3.groupHash(key), name);
            assertEquals(c.get("modulo_index").asInt(), modulo.index(key), name);
            assertEquals(c.get("modulo").asText(), modulo.route(key), name);
            long[] scores = new long[c.get("rendezvous_scores").size()];
            for (int i = 0; i < scores.length; i++) {
                scores[i] = c.get("rendezvous_scores").get(i).asLong();
            }
            assertArrayEquals(scores, rendezvous.scores(key), name);
            assertEquals(c.get("rendezvous").asText(), rendezvous.route(key), name);
            assertEquals(strings(c.get("rendezvous_ranking")), rendezvous.ranking(key), name);
            List<String> rotated = modulo.ranking(key);
            assertEquals(modulo.route(key), rotated.get(0), name);
        }
        for (JsonNode e : v.get("errors")) {
            assertEquals("no-destination", e.get("error").asText());
            assertThrows(GroupRouter.NoDestinationException.class, () -> new GroupRouter(strings(e.get("destinations"))));
        }
    }

    /** key_cases: which id a message routes on under a destination's routing_key (spec/routing.md §2.3). */
    @Test
    void routingKeyVectors() {
        JsonNode v = Vectors.load("group_routing.json");
        int n = 0;
        for (JsonNode c : v.get("key_cases")) {
            String name = c.get("name").asText();
            java.util.Map<String, String> headers = new java.util.LinkedHashMap<>();
            c.get("headers").fields().forEachRemaining(e -> headers.put(e.getKey(), e.getValue().asText()));
            RoutingKey.Key key = RoutingKey.named(c.get("routing_key").asText()).keyOf(headers);
            if (c.get("key_source").isNull()) {
                assertEquals(null, key, name);
                assertTrue(c.get("modulo").isNull() && c.get("rendezvous").isNull(), name);
                continue;
            }
            assertEquals(c.get("key_source").asText(), key.source(), name);
            assertEquals(c.get("key").asText(), key.key(), name);
            List<String> destinations = strings(c.get("destinations"));
            assertEquals(c.get("modulo").asText(), new GroupRouter(destinations, GroupRouter.Strategy.MODULO).route(key.key()), name);
            assertEquals(c.get("rendezvous").asText(), new GroupRouter(destinations).route(key.key()), name);
            n++;
        }
        assertTrue(n > 10);
        for (JsonNode e : v.get("key_errors")) {
            assertEquals("unknown-routing-key", e.get("error").asText());
            assertThrows(IllegalArgumentException.class, () -> RoutingKey.named(e.get("routing_key").asText()));
        }
    }

    @Test
    void loneSurrogatesCannotBeRoutedAndUnknownStrategiesAreRefused() {
        assertThrows(IllegalArgumentException.class, () -> Murmur3.groupHash("a\ud800b"));
        assertThrows(IllegalArgumentException.class, () -> GroupRouter.Strategy.named("random"));
    }

    @Test
    void rendezvousMovesOnlyTheLeaversGroups() {
        List<String> nodes = List.of("n1", "n2", "n3", "n4", "n5");
        GroupRouter before = new GroupRouter(nodes);
        GroupRouter after = new GroupRouter(nodes.subList(0, 4));
        Set<String> moved = new HashSet<>();
        for (int i = 0; i < 2000; i++) {
            String key = "group-" + i;
            String was = before.route(key);
            String now = after.route(key);
            if (!was.equals(now)) {
                assertEquals("n5", was, key);
                moved.add(key);
            }
        }
        assertTrue(moved.size() > 200 && moved.size() < 600, "moved " + moved.size());
    }
}
