package io.pymq.jms;

import io.pymq.testing.Broker;
import io.pymq.testing.Proxy;
import jakarta.jms.Connection;
import jakarta.jms.MessageConsumer;
import jakarta.jms.Session;
import jakarta.jms.TextMessage;
import jakarta.jms.Topic;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

import java.util.UUID;
import java.util.concurrent.TimeUnit;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * setClientID replaces the connection's first STOMP link with one that carries the client id.  The old
 * link's end used to reach the connection as if the current link had ended, waking whatever waited on the
 * new one: over TLS, createDurableSubscriber right after setClientID failed in 2 of 7 runs with "the
 * connection ended during an admin request" (issue 28.5).  Here the timing is forced: the proxy ends the
 * old link from the broker's side as its DISCONNECT goes out (so the link's own reader thread ends it), and
 * that thread is held, after the DISCONNECT has failed and before the connection hears of the end, until
 * the durable subscriber's admin request has gone out on the new link.
 */
class ClientIdSwapTest {
    @AfterEach
    void noHook() {
        BrokerLink.endingForTests = null;
    }

    @Test
    void theReplacedLinksLateEndDoesNotTouchTheNewLink() throws Exception {
        try (Proxy proxy = new Proxy(Broker.address())) {
            PymqConnectionFactory cf = new PymqConnectionFactory("stomp://" + proxy.address() + "?heartBeat=0,0&timeout=5000");
            Connection c = cf.createConnection();
            try {
                BrokerLink first = ((PymqConnection) c).link();
                proxy.cutOnClientCommand(1, "DISCONNECT");
                BrokerLink.endingForTests = ending -> {
                    if (ending != first) {
                        return;
                    }
                    long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(5);
                    while (!proxy.clientWrote(2, "destination:/pymq/admin") && System.nanoTime() < deadline) {
                        Thread.onSpinWait();
                    }
                };
                String id = "swap-" + UUID.randomUUID();
                c.setClientID(id);
                Session s = c.createSession();
                Topic topic = s.createTopic("swap-" + UUID.randomUUID());
                MessageConsumer durable = s.createDurableSubscriber(topic, "d1");
                assertTrue(proxy.clientWrote(2, "destination:/pymq/admin"), "the durable subscriber asked the admin interface");
                c.start();
                s.createProducer(topic).send(s.createTextMessage("after the swap"));
                assertEquals("after the swap", ((TextMessage) durable.receive(5000)).getText());
                assertEquals(id, c.getClientID());
                durable.close();
                s.unsubscribe("d1");
            } finally {
                c.close();
            }
        }
    }
}
