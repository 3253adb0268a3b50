package io.pymq.jms;

import io.pymq.testing.Broker;
import io.pymq.testing.Proxy;
import jakarta.jms.Connection;
import jakarta.jms.DeliveryMode;
import jakarta.jms.Destination;
import jakarta.jms.JMSException;
import jakarta.jms.Message;
import jakarta.jms.MessageConsumer;
import jakarta.jms.MessageProducer;
import jakarta.jms.Queue;
import jakarta.jms.Session;
import jakarta.jms.TextMessage;
import jakarta.jms.Topic;
import jakarta.jms.TransactionRolledBackException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.net.ServerSocket;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.TimeUnit;
import java.util.function.BooleanSupplier;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Failover (spec/ha.md §4) against real brokers: the live A of a live/backup pair over one shared data
 * directory (spec/ha.md §1) is killed with SIGKILL, the backup B takes the store over at another port, and
 * the connection, whose URL names both, carries on without application code.
 */
class FailoverTest {
    static void await(BooleanSupplier done, String what) throws InterruptedException {
        long deadline = System.nanoTime() + TimeUnit.SECONDS.toNanos(30);
        while (!done.getAsBoolean()) {
            if (System.nanoTime() > deadline) {
                throw new AssertionError("timed out waiting for " + what);
            }
            Thread.sleep(10);
        }
    }

    static int freePort() throws Exception {
        try (ServerSocket s = new ServerSocket(0)) {
            return s.getLocalPort();
        }
    }

    private static List<String> drain(MessageConsumer c) throws JMSException {
        List<String> out = new ArrayList<>();
        for (Message m = c.receive(1500); m != null; m = c.receive(500)) {
            out.add(((TextMessage) m).getText());
        }
        return out;
    }

    /** The configuration of a live/backup pair's members (spec/ha.md §2: a 1 s lease, polled every 50 ms). */
    static Path haConfig(Path dir) throws Exception {
        Path yaml = dir.resolve("ha.yaml");
        java.nio.file.Files.writeString(yaml, "ha:\n  lease_ms: 1000\n  poll_ms: 50\n"
                + "heartbeat_send_ms: 500\nheartbeat_recv_ms: 500\n");
        return yaml;
    }

    /**
     * A live/backup pair over one shared directory: {@code a} is live, {@code b} waits as its backup and listens
     * at another port once it takes over; {@code url} names both, with a quick back-off.
     */
    record Pair(Broker.Own a, Broker.Own b, String url) {
        static Pair start(Path dir) throws Exception {
            Path shared = dir.resolve("shared");
            Path yaml = haConfig(dir);
            Broker.Own a = Broker.startMember(shared, 0, yaml);
            String addrA = a.awaitLive(60);
            int portB = freePort();
            Broker.Own b = Broker.startMember(shared, portB, yaml);
            return new Pair(a, b, "failover:(stomp://" + addrA + ",stomp://127.0.0.1:" + portB
                    + ")?initialReconnectDelay=50&maxReconnectDelay=400&jitter=0&timeout=60000");
        }
    }

    /** What a connection's transport listener heard: its events in order, and the temporaries renamed. */
    static final class Heard implements TransportListener {
        final List<String> events = new CopyOnWriteArrayList<>();
        final Map<Set<Destination>, String> renamed = new ConcurrentHashMap<>();

        @Override
        public void transportInterrupted() {
            events.add("interrupted");
        }

        @Override
        public void transportResumed() {
            events.add("resumed");
        }

        @Override
        public void temporariesRenamed(Set<Destination> temporaries, String why) {
            events.add("renamed");
            renamed.put(temporaries, why);
        }
    }

    @Test
    void aTakeoverOfARealPairIsFollowedWithoutApplicationCode(@TempDir Path dir) throws Exception {
        Pair pair = Pair.start(dir);
        Broker.Own a = pair.a();
        Broker.Own b = pair.b();
        String id = UUID.randomUUID().toString().substring(0, 8);
        PymqConnectionFactory cf = new PymqConnectionFactory(pair.url());
        Heard transport = new Heard();
        List<String> events = transport.events;
        cf.setTransportListener(transport);
        Connection c = cf.createConnection();
        try {
            assertEquals(null, b.address, "the second member waits as a backup");
            List<JMSException> failures = new CopyOnWriteArrayList<>();
            c.setClientID("ha-" + id);
            c.setExceptionListener(failures::add);
            c.start();
            Session producing = c.createSession();
            Queue listened = producing.createQueue("ha-listened-" + id);
            Queue clientAcked = producing.createQueue("ha-client-" + id);
            Queue transacted = producing.createQueue("ha-tx-" + id);
            Queue flow = producing.createQueue("ha-flow-" + id);
            Topic topic = producing.createTopic("ha-topic-" + id);
            MessageProducer producer = producing.createProducer(null);

            List<String> heard = Collections.synchronizedList(new ArrayList<>());
            Session listening = c.createSession();
            listening.createConsumer(listened).setMessageListener(m -> {
                try {
                    heard.add(((TextMessage) m).getText());
                } catch (JMSException e) {
                    throw new IllegalStateException(e);
                }
            });
            Session clientSession = c.createSession(Session.CLIENT_ACKNOWLEDGE);
            MessageConsumer clientConsumer = clientSession.createConsumer(clientAcked);
            Session durableSession = c.createSession();
            MessageConsumer durable = durableSession.createDurableSubscriber(topic, "d", "n > 0", false);
            Session sharedSession = c.createSession();
            MessageConsumer sharedDurable = sharedSession.createSharedDurableConsumer(topic, "sd-" + id);
            MessageConsumer sharedPlain = sharedSession.createSharedConsumer(topic, "s-" + id);
            Session txSession = c.createSession(Session.SESSION_TRANSACTED);
            MessageProducer txProducer = txSession.createProducer(transacted);

            producer.send(listened, producing.createTextMessage("before"));
            await(() -> heard.contains("before"), "the listener before the takeover");
            producer.send(clientAcked, producing.createTextMessage("held"));
            Message held = clientConsumer.receive(5000);
            assertEquals("held", ((TextMessage) held).getText());
            assertFalse(held.getJMSRedelivered());
            txProducer.send(txSession.createTextMessage("lost with the transaction"));

            // a producer whose persistent sends return with their receipts, and a client-acknowledging
            // consumer, both running while the live dies
            List<String> receipted = new CopyOnWriteArrayList<>();
            List<String[]> seen = new CopyOnWriteArrayList<>();   // text, redelivered
            java.util.concurrent.atomic.AtomicBoolean stop = new java.util.concurrent.atomic.AtomicBoolean();
            Session flowOut = c.createSession();
            MessageProducer flowProducer = flowOut.createProducer(flow);
            flowProducer.setDeliveryMode(DeliveryMode.PERSISTENT);
            CompletableFuture<Void> producing2 = CompletableFuture.runAsync(() -> {
                try {
                    for (int i = 0; !stop.get(); i++) {
                        flowProducer.send(flowOut.createTextMessage("flow-" + i));
                        receipted.add("flow-" + i);
                    }
                } catch (JMSException e) {
                    throw new IllegalStateException(e);
                }
            });
            Session flowIn = c.createSession(Session.CLIENT_ACKNOWLEDGE);
            MessageConsumer flowConsumer = flowIn.createConsumer(flow);
            CompletableFuture<Void> consuming = CompletableFuture.runAsync(() -> {
                try {
                    while (true) {
                        Message m = flowConsumer.receive(3000);
                        if (m == null) {
                            if (stop.get()) {
                                return;       // quiet for 3 s after the producer stopped: all there is
                            }
                            continue;
                        }
                        seen.add(new String[] {((TextMessage) m).getText(), Boolean.toString(m.getJMSRedelivered())});
                        m.acknowledge();      // does nothing for a delivery of the lost link: it comes again
                    }
                } catch (JMSException e) {
                    throw new IllegalStateException(e);
                }
            });
            await(() -> receipted.size() >= 20, "the producer before the kill");

            a.kill();
            await(() -> events.contains("interrupted"), "transportInterrupted");
            int atKill = receipted.size();
            // a send made while no broker is there waits for the next one
            CompletableFuture<Void> during = CompletableFuture.runAsync(() -> {
                try {
                    producer.send(listened, producing.createTextMessage("during"));
                } catch (JMSException e) {
                    throw new IllegalStateException(e);
                }
            });
            b.awaitLive(60);
            during.get(60, TimeUnit.SECONDS);
            await(() -> events.contains("resumed"), "transportResumed");
            assertEquals(List.of("interrupted", "resumed"), events);
            await(() -> receipted.size() >= atKill + 20, "the producer after the takeover");
            stop.set(true);
            producing2.get(60, TimeUnit.SECONDS);
            consuming.get(60, TimeUnit.SECONDS);
            java.util.Map<String, Integer> times = new java.util.HashMap<>();
            for (String[] r : seen) {
                int n = times.merge(r[0], 1, Integer::sum);
                assertTrue(n == 1 || Boolean.parseBoolean(r[1]), r[0] + " came again unflagged");
            }
            for (String text : receipted) {
                assertTrue(times.containsKey(text), "the receipted " + text + " was lost");
            }

            // listeners kept running
            producer.send(listened, producing.createTextMessage("after"));
            await(() -> heard.contains("during") && heard.contains("after"), "the listener after the takeover");

            // the unacknowledged delivery comes back redelivered; acknowledging the old one does nothing
            held.acknowledge();
            Message again = clientConsumer.receive(5000);
            assertNotNull(again, "the unacknowledged message is delivered again");
            assertEquals("held", ((TextMessage) again).getText());
            assertTrue(again.getJMSRedelivered());
            again.acknowledge();

            // the open transaction fails at commit, whole; the next one starts clean
            assertThrows(TransactionRolledBackException.class, txSession::commit);
            txProducer.send(txSession.createTextMessage("committed"));
            txSession.commit();
            MessageConsumer txReader = producing.createConsumer(transacted);
            assertEquals(List.of("committed"), drain(txReader));

            // the durable subscription is the same one, selector included; the shared ones by their names
            TextMessage yes = producing.createTextMessage("selected");
            yes.setIntProperty("n", 1);
            TextMessage no = producing.createTextMessage("not selected");
            no.setIntProperty("n", 0);
            producer.send(topic, no);
            producer.send(topic, yes);
            assertEquals(List.of("selected"), drain(durable));
            assertEquals(List.of("not selected", "selected"), drain(sharedDurable));
            assertEquals(List.of("not selected", "selected"), drain(sharedPlain));

            assertTrue(failures.isEmpty(), "the exception listener hears nothing while a broker answers: " + failures);
            durable.close();
            durableSession.unsubscribe("d");
            sharedDurable.close();
            sharedSession.unsubscribe("sd-" + id);
        } finally {
            c.close();
            a.kill();
            b.kill();
        }
    }

    @Test
    void sendsWithoutTheirReceiptGoAgainAndTheBrokerKeepsOneCopy() throws Exception {
        try (Proxy proxy = new Proxy(Broker.address())) {
            String id = UUID.randomUUID().toString().substring(0, 8);
            PymqConnectionFactory cf = new PymqConnectionFactory("failover:(stomp://" + proxy.address()
                    + ")?initialReconnectDelay=20&timeout=30000");
            Connection c = cf.createConnection();
            try {
                Session s = c.createSession();
                Queue q = s.createQueue("ha-resend-" + id);
                MessageProducer p = s.createProducer(q);
                proxy.dropServerCommand(1, "RECEIPT");      // the broker takes the SENDs; their receipts never arrive
                CompletableFuture<Void> persistent = CompletableFuture.runAsync(() -> {
                    try {
                        p.send(s.createTextMessage("persistent"));
                    } catch (JMSException e) {
                        throw new IllegalStateException(e);
                    }
                });
                PymqConnection pc = (PymqConnection) c;
                await(() -> proxy.clientWrote(1, "persistent"), "the persistent SEND");
                Session other = c.createSession();
                MessageProducer quick = other.createProducer(q);
                quick.setDeliveryMode(DeliveryMode.NON_PERSISTENT);
                for (int i = 1; i <= 3; i++) {
                    quick.send(other.createTextMessage("quick-" + i));
                }
                Thread.sleep(200);      // the broker has them all (nothing to wait on: their receipts are dropped)
                assertFalse(persistent.isDone(), "a persistent send waits for its receipt");
                proxy.cutAll();
                persistent.get(30, TimeUnit.SECONDS);
                assertTrue(proxy.connections() >= 2, "the connection was made again");
                c.start();
                MessageConsumer consumer = s.createConsumer(q);
                List<String> got = drain(consumer);
                Collections.sort(got);
                assertEquals(List.of("persistent", "quick-1", "quick-2", "quick-3"), got,
                        "every SEND once: re-sent with its dedup id, the broker dropped the copies");
                assertEquals(PymqConnection.Status.OPEN, pc.status());
            } finally {
                c.close();
            }
        }
    }

    @Test
    void aClientIdTheBrokerStillHoldsForAHalfOpenLinkIsWaitedFor() throws Exception {
        try (Proxy proxy = new Proxy(Broker.address())) {
            PymqConnectionFactory cf = new PymqConnectionFactory("failover:(stomp://" + proxy.address()
                    + ")?initialReconnectDelay=20&maxReconnectDelay=100&timeout=30000");
            List<JMSException> failures = new CopyOnWriteArrayList<>();
            Connection c = cf.createConnection();
            try {
                c.setClientID("ha-held-" + UUID.randomUUID());
                c.setExceptionListener(failures::add);
                c.start();
                Session s = c.createSession();
                Queue q = s.createQueue("ha-held-" + UUID.randomUUID());
                MessageConsumer consumer = s.createConsumer(q);
                // without a re-claim token (a broker with temporary_reclaim_ms: 0): a re-claim would make
                // the broker end the half-open link at once (spec/ha.md section 4.7 rule 2)
                ((PymqConnection) c).reclaimTokenForTests(null);
                // connection 2 carries the client id (setClientID replaced connection 1)
                proxy.cutClientOnly(2);
                await(() -> proxy.connections() >= 4 || !failures.isEmpty(),
                        "reconnection attempts refused while the broker holds the id");
                assertTrue(failures.isEmpty(), "a client id the broker still holds is not final: " + failures);
                proxy.endHalfOpen();          // the broker sees the old link end and frees the client id
                s.createProducer(q).send(s.createTextMessage("back"));
                assertEquals("back", ((TextMessage) consumer.receive(10000)).getText());
                assertTrue(failures.isEmpty(), failures.toString());
            } finally {
                c.close();
            }
        }
    }

    @Test
    void theExceptionListenerHearsOnlyWhenEveryAttemptIsSpent() throws Exception {
        Proxy proxy = new Proxy(Broker.address());
        PymqConnectionFactory cf = new PymqConnectionFactory("failover:(stomp://" + proxy.address()
                + ")?initialReconnectDelay=20&maxReconnectAttempts=3");
        Heard transport = new Heard();
        List<String> events = transport.events;
        cf.setTransportListener(transport);
        Connection c = cf.createConnection();
        List<JMSException> failures = new CopyOnWriteArrayList<>();
        c.setExceptionListener(failures::add);
        Session s = c.createSession();
        Queue q = s.createQueue("ha-spent-" + UUID.randomUUID());
        MessageConsumer consumer = s.createConsumer(q);
        c.start();
        proxy.close();              // no broker answers at that address any more
        await(() -> !failures.isEmpty(), "the exception listener");
        assertEquals(List.of("interrupted"), events);
        assertEquals(1, failures.size());
        assertTrue(failures.get(0).getMessage().contains("3 attempts"), failures.get(0).getMessage());
        assertThrows(JMSException.class, () -> consumer.receive(100), "calls of an ended connection say why");
        assertThrows(JMSException.class, () -> s.createProducer(q).send(s.createTextMessage("x")));
        c.close();
    }

    /**
     * connectionTimeout (spec/ha.md §4.2) bounds each attempt: a broker whose port accepts TCP connections and
     * never answers (a SIGSTOPped live's does the same) is passed over for the next one, at the first connect
     * and after a loss.  The connection's own timeout is 30 s: without the option the first connect takes it
     * all (a generous bound of 20 s fails), and the send after the loss outlives the failover timeout of 20 s.
     */
    @Test
    void aSilentBrokerIsPassedOverWithinConnectionTimeout() throws Exception {
        try (ServerSocket silent = new ServerSocket(0, 50, java.net.InetAddress.getLoopbackAddress());
             Proxy proxy = new Proxy(Broker.address())) {
            String options = "?connectionTimeout=2000&initialReconnectDelay=20&maxReconnectDelay=200&timeout=20000";
            String silentUrl = "stomp://127.0.0.1:" + silent.getLocalPort();
            PymqConnectionFactory first = new PymqConnectionFactory("failover:(" + silentUrl + ",stomp://"
                    + Broker.address() + ")" + options);
            first.setTimeout(30000);
            long started = System.nanoTime();
            first.createConnection().close();
            assertTrue(System.nanoTime() - started < TimeUnit.SECONDS.toNanos(20),
                    "the attempt on the silent port ended after connectionTimeout, not the connection's timeout");

            // after a loss the attempts start with the broker after the lost one: the silent one
            PymqConnectionFactory cf = new PymqConnectionFactory("failover:(stomp://" + proxy.address() + ","
                    + silentUrl + ",stomp://" + Broker.address() + ")" + options);
            cf.setTimeout(30000);
            Heard transport = new Heard();
            List<String> events = transport.events;
            cf.setTransportListener(transport);
            Connection c = cf.createConnection();
            try {
                c.start();
                Session s = c.createSession();
                Queue q = s.createQueue("silent-" + UUID.randomUUID());
                MessageConsumer consumer = s.createConsumer(q);
                MessageProducer producer = s.createProducer(q);
                proxy.cutAll();
                await(() -> events.contains("interrupted"), "transportInterrupted");
                producer.send(s.createTextMessage("after"));       // waits while it reconnects
                Message m = consumer.receive(10000);
                assertNotNull(m, "the message sent after the loss");
                assertEquals("after", ((TextMessage) m).getText());
                assertEquals(List.of("interrupted", "resumed"), events);
            } finally {
                c.close();
            }
        }
    }
}
