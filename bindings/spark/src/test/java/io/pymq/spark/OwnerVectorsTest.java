package io.pymq.spark;

import com.fasterxml.jackson.databind.JsonNode;
import org.junit.jupiter.api.Test;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** spec/vectors/worker_owners.json: the worker a task connects to is the broker's owner (spec/cores.md §2). */
class OwnerVectorsTest {
    @Test
    void ownersMatchTheVectors() throws Exception {
        int numbered = 0;
        int hashed = 0;
        for (JsonNode c : VectorFiles.load("worker_owners.json").get("cases")) {
            String placement = c.get("placement").asText();
            assertEquals(c.get("owner").asInt(), Planner.owner(c.get("destination").asText(), c.get("workers").asInt(),
                    placement), c.toString());
            if (placement.equals(Planner.NUMBERED)) {
                numbered++;
            } else {
                hashed++;
            }
        }
        assertTrue(numbered > 100 && hashed > 100, numbered + " numbered, " + hashed + " hash");
    }

    /** A placement rule this reader does not know (a later broker's): no owner, the task goes to any worker. */
    @Test
    void anUnknownPlacementAimsAtNoWorker() {
        assertEquals(-1, Planner.owner("/queue/orders.1", 2, "table"));
        assertEquals(-1, Planner.owner("/queue/orders.1", 2, ""));
    }
}
