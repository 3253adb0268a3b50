package io.pymq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** spec/vectors/worker_owners.json: the worker a task connects to is the broker's owner (spec/cores.md §2). */
class OwnerVectorsTest {
    @Test
    void ownersMatchTheVectors() throws Exception {
        int checked = 0;
        for (JsonNode c : VectorFiles.load("worker_owners.json").get("cases")) {
            assertEquals(c.get("owner").asInt(), Planner.owner(c.get("destination").asText(), c.get("workers").asInt()),
                    c.toString());
            checked++;
        }
        assertTrue(checked > 100);
    }
}
