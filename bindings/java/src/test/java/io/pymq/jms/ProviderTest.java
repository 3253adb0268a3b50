package io.pymq.jms;

import io.pymq.testing.Broker;
import jakarta.jms.BytesMessage;
import jakarta.jms.CompletionListener;
import jakarta.jms.Connection;
import jakarta.jms.ConnectionFactory;
import jakarta.jms.DeliveryMode;
import jakarta.jms.IllegalStateException;
import jakarta.jms.InvalidClientIDException;
import jakarta.jms.InvalidDestinationException;
import jakarta.jms.InvalidSelectorException;
import jakarta.jms.JMSException;
import jakarta.jms.JMSSecurityException;
import jakarta.jms.MapMessage;
import jakarta.jms.Message;
import jakarta.jms.MessageConsumer;
import jakarta.jms.MessageFormatException;
import jakarta.jms.MessageNotWriteableException;
import jakarta.jms.MessageProducer;
import jakarta.jms.Queue;
import jakarta.jms.QueueBrowser;
import jakarta.jms.QueueConnection;
import jakarta.jms.QueueRequestor;
import jakarta.jms.QueueSession;
import jakarta.jms.Session;
import jakarta.jms.TemporaryQueue;
import jakarta.jms.TemporaryTopic;
import jakarta.jms.TextMessage;
import jakarta.jms.Topic;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;

import java.util.ArrayList;
import java.util.Collections;
import java.util.Enumeration;
import java.util.List;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/** The provider against a real pymq-server: the JMS API as an application written to jakarta.jms uses it. */
class ProviderTest {
    private final List<Connection> opened = new ArrayList<>();
    private String name;

    @org.junit.jupiter.api.BeforeEach
    void name(TestInfo info) {
        this.name = info.getTestMethod().map(m -> m.getName()).orElse("t") + "-" + UUID.randomUUID().toString().substring(0, 8);
    }

    @AfterEach
    void closeAll() {
        for (Connection c : opened) {
            try {
                c.close();
            } catch (JMSException ignored) {
                // a test that broke its connection on purpose
            }
        }
    }

    private ConnectionFactory factory() {
        return new PymqConnectionFactory(Broker.url());
    }

    private Connection connect() throws JMSException {
        Connection c = factory().createConnection();
        opened.add(c);
        c.start();
        return c;
    }

    private Queue queue(Session s) throws JMSException {
        return s.createQueue("java-" + name);
    }

    private List<String> drain(Queue q, long firstWaitMs) throws JMSException {
        Connection c = connect();
        Session s = c.createSession();
        MessageConsumer consumer = s.createConsumer(q);
        List<String> out = new ArrayList<>();
        for (long wait = firstWaitMs; ; wait = 300) {
            Message m = consumer.receive(wait);
            if (m == null) {
                return out;
            }
            out.add(((TextMessage) m).getText());
        }
    }

    // -- connections ---------------------------------------------------------------------------------
    @Test
    void connectsAuthenticatesAndReportsMetadata() throws JMSException {
        Connection c = connect();
        assertEquals("3.1", c.getMetaData().getJMSVersion());
        assertTrue(c.getMetaData().getJMSProviderName().startsWith("pymq"));
        assertTrue(Collections.list(c.getMetaData().getJMSXPropertyNames()).contains("JMSXDeliveryCount"));
        JMSSecurityException refused = assertThrows(JMSSecurityException.class,
                () -> factory().createConnection("guest", "not-the-password"));
        assertEquals("authentication-failed", refused.getErrorCode());
        assertThrows(IllegalArgumentException.class, () -> new PymqConnectionFactory("http://127.0.0.1:1"));
        assertThrows(IllegalArgumentException.class, () -> new PymqConnectionFactory(Broker.url("nosuch=1")));
        PymqConnectionFactory withCredentials = new PymqConnectionFactory("stomp://guest:guest@" + Broker.address()
                + "?prefetch=5&timeout=5000&heartBeat=2000,2000");
        Connection second = withCredentials.createConnection();
        opened.add(second);
        assertNull(second.getClientID());
    }

    @Test
    void clientIdFromTheUrlFromSetClientIdAndTakenIds() throws JMSException {
        String id = "java-client-" + name;
        Connection a = new PymqConnectionFactory(Broker.url("clientId=" + id)).createConnection();
        opened.add(a);
        assertEquals(id, a.getClientID());
        assertThrows(IllegalStateException.class, () -> a.setClientID("other"));
        Connection b = factory().createConnection();
        opened.add(b);
        assertThrows(InvalidClientIDException.class, () -> b.setClientID(id), "a client id in use elsewhere");
        Connection c = factory().createConnection();
        opened.add(c);
        c.setClientID(id + "-2");
        assertEquals(id + "-2", c.getClientID());
        Connection d = factory().createConnection();
        opened.add(d);
        d.createSession();
        assertThrows(IllegalStateException.class, () -> d.setClientID("late"), "only before the connection is used");
    }

    @Test
    void stoppedConnectionsHoldDeliveryUntilStarted() throws Exception {
        Connection c = factory().createConnection();
        opened.add(c);
        Session s = c.createSession();
        Queue q = queue(s);
        s.createProducer(q).send(s.createTextMessage("held"));
        MessageConsumer consumer = s.createConsumer(q);
        assertNull(consumer.receive(300), "not started: nothing is delivered");
        assertNull(consumer.receiveNoWait());
        c.start();
        assertEquals("held", ((TextMessage) consumer.receive(5000)).getText());
        c.stop();
        s.createProducer(q).send(s.createTextMessage("second"));
        assertNull(consumer.receive(300));
        c.start();
        assertEquals("second", ((TextMessage) consumer.receive(5000)).getText());
    }

    // -- messages ----------------------------------------------------------------------------------------
    @Test
    void textBytesAndMapMessagesWithHeadersAndTypedPropertiesRoundTrip() throws JMSException {
        Connection c = connect();
        Session s = c.createSession();
        Queue q = queue(s);
        Queue replyTo = s.createQueue("java-reply-" + name);
        MessageProducer p = s.createProducer(q);
        p.setPriority(7);
        p.setTimeToLive(600_000);
        TextMessage t = s.createTextMessage("héllo ✓");
        t.setJMSCorrelationID("corr-1");
        t.setJMSType("order");
        t.setJMSReplyTo(replyTo);
        t.setIntProperty("qty", 3);
        t.setLongProperty("big", 9_007_199_254_740_993L);
        t.setDoubleProperty("ratio", 0.1);
        t.setFloatProperty("f", 1.5f);
        t.setBooleanProperty("flag", true);
        t.setStringProperty("label", "a:b\nc");
        t.setShortProperty("s", (short) -2);
        t.setByteProperty("b", (byte) 7);
        t.setFloatProperty("tenth", 0.1f);
        t.setIntProperty("min", Integer.MIN_VALUE);
        t.setStringProperty("JMSXGroupID", "g-1");
        p.send(t);
        assertNotNull(t.getJMSMessageID(), "a persistent send waits for the receipt and gets the broker's id");
        assertTrue(t.getJMSMessageID().startsWith("ID:"));
        BytesMessage b = s.createBytesMessage();
        b.writeInt(42);
        b.writeUTF("ütf");
        b.writeBytes(new byte[] {0, 1, (byte) 0xff});
        p.send(b, DeliveryMode.NON_PERSISTENT, 7, 0);
        MapMessage m = s.createMapMessage();
        m.setString("sku", "A-1");
        m.setInt("qty", 3);
        m.setDouble("price", 9.5);
        m.setBoolean("gift", false);
        m.setBytes("blob", new byte[] {0, 1, (byte) 0xff});
        m.setObject("none", null);
        m.setChar("c", 'x');
        p.send(m);

        MessageConsumer consumer = s.createConsumer(q);
        TextMessage gotT = (TextMessage) consumer.receive(5000);
        assertEquals("héllo ✓", gotT.getText());
        assertEquals(t.getJMSMessageID(), gotT.getJMSMessageID());
        assertEquals("corr-1", gotT.getJMSCorrelationID());
        assertEquals("order", gotT.getJMSType());
        assertEquals(replyTo, gotT.getJMSReplyTo());
        assertEquals(q, gotT.getJMSDestination());
        assertEquals(7, gotT.getJMSPriority());
        assertEquals(DeliveryMode.PERSISTENT, gotT.getJMSDeliveryMode());
        assertTrue(gotT.getJMSExpiration() > gotT.getJMSTimestamp());
        assertEquals(3, gotT.getIntProperty("qty"));
        // JMS 3.1 §3.5.4: getObjectProperty gives back the type that was set (issue 27.6)
        assertEquals(Integer.valueOf(3), gotT.getObjectProperty("qty"));
        assertEquals(Long.valueOf(9_007_199_254_740_993L), gotT.getObjectProperty("big"));
        assertEquals(Double.valueOf(0.1), gotT.getObjectProperty("ratio"));
        assertEquals(Float.valueOf(1.5f), gotT.getObjectProperty("f"));
        assertEquals(Float.valueOf(0.1f), gotT.getObjectProperty("tenth"));
        assertEquals(Short.valueOf((short) -2), gotT.getObjectProperty("s"));
        assertEquals(Byte.valueOf((byte) 7), gotT.getObjectProperty("b"));
        assertEquals(Integer.valueOf(Integer.MIN_VALUE), gotT.getObjectProperty("min"));
        assertFalse(gotT.propertyExists("pymq-jms-types"), "the type header is not a property");
        assertEquals(9_007_199_254_740_993L, gotT.getLongProperty("big"));
        assertEquals(0.1, gotT.getDoubleProperty("ratio"));
        assertEquals(1.5f, gotT.getFloatProperty("f"));
        assertTrue(gotT.getBooleanProperty("flag"));
        assertEquals("a:b\nc", gotT.getStringProperty("label"));
        assertEquals((short) -2, gotT.getShortProperty("s"));
        assertEquals((byte) 7, gotT.getByteProperty("b"));
        assertEquals("g-1", gotT.getStringProperty("JMSXGroupID"));
        assertEquals(1, gotT.getIntProperty("JMSXDeliveryCount"));
        assertFalse(gotT.getJMSRedelivered());
        assertThrows(MessageFormatException.class, () -> gotT.getIntProperty("big"), "does not fit: no silent truncation");
        assertThrows(MessageFormatException.class, () -> gotT.getIntProperty("flag"));
        assertThrows(MessageNotWriteableException.class, () -> gotT.setText("x"));
        assertThrows(MessageNotWriteableException.class, () -> gotT.setIntProperty("x", 1));
        gotT.clearProperties();
        gotT.setIntProperty("x", 1);

        BytesMessage gotB = (BytesMessage) consumer.receive(5000);
        assertEquals(DeliveryMode.NON_PERSISTENT, gotB.getJMSDeliveryMode());
        assertEquals(42, gotB.readInt());
        assertEquals("ütf", gotB.readUTF());
        byte[] rest = new byte[3];
        assertEquals(3, gotB.readBytes(rest));
        assertArrayEquals(new byte[] {0, 1, (byte) 0xff}, rest);
        assertEquals(-1, gotB.readBytes(rest));

        MapMessage gotM = (MapMessage) consumer.receive(5000);
        assertEquals("A-1", gotM.getString("sku"));
        assertEquals(3, gotM.getInt("qty"));
        assertEquals(9.5, gotM.getDouble("price"));
        assertFalse(gotM.getBoolean("gift"));
        assertArrayEquals(new byte[] {0, 1, (byte) 0xff}, gotM.getBytes("blob"));
        assertTrue(gotM.itemExists("none"));
        assertNull(gotM.getObject("none"));
        assertEquals('x', gotM.getChar("c"));
        assertEquals(List.of("sku", "qty", "price", "gift", "blob", "none", "c"), Collections.list(gotM.getMapNames()));
        assertNull(consumer.receive(200));
    }

    /**
     * JMS 3.11.3: MapMessage.getObject gives back the type that was set (issue 27.6), through the broker and
     * again after a forward of the received message unchanged; an entry whose name pymq-jms-types cannot
     * carry (',' or '=') comes back as JSON's Long; the getters still convert.
     */
    @Test
    void mapMessageEntriesComeBackAsTheTypeThatWasSet() throws JMSException {
        Connection c = connect();
        Session s = c.createSession();
        Queue q = queue(s);
        Queue forwarded = s.createQueue("java-fwd-" + name);
        MapMessage m = s.createMapMessage();
        m.setInt("i", 3);
        m.setShort("sh", (short) -7);
        m.setByte("by", (byte) 5);
        m.setFloat("f", 0.1f);                  // as a double it would be 0.10000000149011612
        m.setChar("ch", 'x');
        m.setLong("l", 9_007_199_254_740_993L);
        m.setDouble("d", 0.1);
        m.setString("s", "y");                  // a one-character string stays a String
        m.setInt("a,b", 4);
        m.setObject("o", Integer.valueOf(42));
        s.createProducer(q).send(m);
        MessageConsumer consumer = s.createConsumer(q);
        MapMessage got = (MapMessage) consumer.receive(5000);
        assertNotNull(got);
        s.createProducer(forwarded).send(got);
        MapMessage again = (MapMessage) s.createConsumer(forwarded).receive(5000);
        assertNotNull(again);
        for (MapMessage r : List.of(got, again)) {
            assertEquals(Integer.valueOf(3), r.getObject("i"));
            assertEquals(Short.valueOf((short) -7), r.getObject("sh"));
            assertEquals(Byte.valueOf((byte) 5), r.getObject("by"));
            assertEquals(Float.valueOf(0.1f), r.getObject("f"));
            assertEquals(Character.valueOf('x'), r.getObject("ch"));
            assertEquals(Long.valueOf(9_007_199_254_740_993L), r.getObject("l"));
            assertEquals(Double.valueOf(0.1), r.getObject("d"));
            assertEquals("y", r.getObject("s"));
            assertEquals(Long.valueOf(4), r.getObject("a,b"));
            assertEquals(Integer.valueOf(42), r.getObject("o"));
            assertEquals(3L, r.getLong("i"));
            assertEquals(0.1f, r.getFloat("f"));
        }
    }

    @Test
    void badPropertyNamesAndObjectOrStreamMessagesAreRefusedBeforeSending() throws JMSException {
        Session s = connect().createSession();
        TextMessage t = s.createTextMessage("x");
        assertThrows(IllegalArgumentException.class, () -> t.setStringProperty("a,b", "v"));
        assertThrows(IllegalArgumentException.class, () -> t.setStringProperty("priority", "v"));
        assertThrows(IllegalArgumentException.class, () -> t.setStringProperty("", "v"));
        assertThrows(MessageFormatException.class, () -> t.setDoubleProperty("nan", Double.NaN));
        assertThrows(MessageFormatException.class, () -> t.setObjectProperty("list", List.of()));
        JMSException object = assertThrows(JMSException.class, () -> s.createObjectMessage("x"));
        assertTrue(object.getMessage().contains("ObjectMessage"));
        assertThrows(JMSException.class, s::createStreamMessage);
        assertThrows(InvalidDestinationException.class, () -> s.createQueue(""));
        assertThrows(InvalidDestinationException.class, () -> s.createQueue("x".repeat(256)));
        assertThrows(InvalidDestinationException.class, () -> s.createQueue("/topic/x"));
        assertEquals("orders", s.createQueue("/queue/orders").getQueueName());
        assertThrows(JMSException.class, () -> s.createProducer(queue(s)).setPriority(10));
    }

    @Test
    void priorityOrdersWaitingMessages() throws JMSException {
        Connection c = connect();
        Session s = c.createSession();
        Queue q = queue(s);
        MessageProducer p = s.createProducer(q);
        p.send(s.createTextMessage("low"), DeliveryMode.PERSISTENT, 1, 0);
        p.send(s.createTextMessage("high"), DeliveryMode.PERSISTENT, 9, 0);
        assertEquals(List.of("high", "low"), drain(q, 5000));
    }

    @Test
    void timeToLiveExpiresAndDeliveryDelayHoldsBack() throws Exception {
        Connection c = connect();
        Session s = c.createSession();
        Queue q = queue(s);
        MessageProducer p = s.createProducer(q);
        p.send(s.createTextMessage("expires"), DeliveryMode.PERSISTENT, 4, 50);
        Thread.sleep(400);
        p.setDeliveryDelay(1500);
        TextMessage delayed = s.createTextMessage("delayed");
        p.send(delayed);
        assertTrue(delayed.getJMSDeliveryTime() >= delayed.getJMSTimestamp() + 1500);
        MessageConsumer consumer = s.createConsumer(q);
        assertNull(consumer.receive(200), "expired and not yet due: nothing");
        TextMessage got = (TextMessage) consumer.receive(10_000);
        assertEquals("delayed", got.getText());
        assertTrue(got.getJMSDeliveryTime() >= got.getJMSTimestamp() + 1500);
        assertNull(consumer.receive(200));
    }

    @Test
    void asyncSendCallsTheCompletionListenerWithTheBrokersId() throws Exception {
        Connection c = connect();
        Session s = c.createSession();
        Queue q = queue(s);
        MessageProducer p = s.createProducer(q);
        List<String> completed = new CopyOnWriteArrayList<>();
        CountDownLatch done = new CountDownLatch(5);
        for (int i = 0; i < 5; i++) {
            p.send(s.createTextMessage("a" + i), new CompletionListener() {
                @Override
                public void onCompletion(Message message) {
                    try {
                        completed.add(((TextMessage) message).getText() + "=" + message.getJMSMessageID());
                    } catch (JMSException e) {
                        completed.add("error " + e);
                    }
                    done.countDown();
                }

                @Override
                public void onException(Message message, Exception exception) {
                    completed.add("failed " + exception);
                    done.countDown();
                }
            });
        }
        assertTrue(done.await(10, TimeUnit.SECONDS));
        assertEquals(5, completed.size());
        for (int i = 0; i < 5; i++) {
            assertTrue(completed.get(i).startsWith("a" + i + "=ID:"), completed.toString());   // in send order
        }
        assertEquals(List.of("a0", "a1", "a2", "a3", "a4"), drain(q, 5000));
    }

    // -- acknowledgement and transactions ------------------------------------------------------------------
    @Test
    void clientAcknowledgeAndRecover() throws JMSException {
        Connection c = connect();
        Session producer = c.createSession();
        Queue q = queue(producer);
        MessageProducer p = producer.createProducer(q);
        for (int i = 0; i < 4; i++) {
            p.send(producer.createTextMessage("m" + i));
        }
        Session s = c.createSession(Session.CLIENT_ACKNOWLEDGE);
        MessageConsumer consumer = s.createConsumer(q);
        assertEquals("m0", ((TextMessage) consumer.receive(5000)).getText());
        Message m1 = consumer.receive(5000);
        assertEquals("m1", ((TextMessage) m1).getText());
        s.recover();
        Message again = consumer.receive(5000);
        assertEquals("m0", ((TextMessage) again).getText(), "recover restarts from the oldest unacknowledged");
        assertTrue(again.getJMSRedelivered());
        assertEquals(2, again.getIntProperty("JMSXDeliveryCount"));
        assertEquals("m1", ((TextMessage) consumer.receive(5000)).getText());
        again.acknowledge();      // acknowledges everything the session consumed
        assertEquals("m2", ((TextMessage) consumer.receive(5000)).getText());
        s.close();               // m2 was not acknowledged: it comes back
        assertEquals(List.of("m2", "m3"), drain(q, 5000));
    }

    @Test
    void dupsOkAcknowledgesAsItGoes() throws JMSException {
        Connection c = connect();
        Session s = c.createSession(Session.DUPS_OK_ACKNOWLEDGE);
        Queue q = queue(s);
        MessageProducer p = s.createProducer(q);
        for (int i = 0; i < 3; i++) {
            p.send(s.createTextMessage("d" + i));
        }
        MessageConsumer consumer = s.createConsumer(q);
        for (int i = 0; i < 3; i++) {
            assertEquals("d" + i, ((TextMessage) consumer.receive(5000)).getText());
        }
        s.close();
        assertEquals(List.of(), drain(q, 500));
    }

    @Test
    void transactedSessionsCommitAndRollBackSendsAndReceives() throws JMSException {
        Connection c = connect();
        Session tx = c.createSession(Session.SESSION_TRANSACTED);
        assertTrue(tx.getTransacted());
        Queue q = queue(tx);
        MessageProducer p = tx.createProducer(q);
        p.send(tx.createTextMessage("t1"));
        p.send(tx.createTextMessage("t2"));
        Session plain = c.createSession();
        MessageConsumer peek = plain.createConsumer(q);
        assertNull(peek.receive(300), "uncommitted sends are invisible");
        peek.close();
        tx.rollback();
        p.send(tx.createTextMessage("t3"));
        tx.commit();
        MessageConsumer consumer = tx.createConsumer(q);
        TextMessage got = (TextMessage) consumer.receive(5000);
        assertEquals("t3", got.getText());
        tx.rollback();
        TextMessage redelivered = (TextMessage) consumer.receive(5000);
        assertEquals("t3", redelivered.getText());
        assertTrue(redelivered.getJMSRedelivered());
        tx.commit();
        consumer.close();
        assertEquals(List.of(), drain(q, 500));
        assertThrows(IllegalStateException.class, tx::recover);
        assertThrows(IllegalStateException.class, plain::commit);
    }

    @Test
    void listenersRunInOrderAndAFailingListenerGetsTheMessageAgain() throws Exception {
        Connection c = connect();
        Session s = c.createSession();
        Queue q = queue(s);
        List<String> seen = new CopyOnWriteArrayList<>();
        CountDownLatch done = new CountDownLatch(4);
        AtomicReference<Exception> closeFromListener = new AtomicReference<>();
        MessageConsumer consumer = s.createConsumer(q);
        consumer.setMessageListener(message -> {
            try {
                String text = ((TextMessage) message).getText();
                if (text.equals("one")) {
                    try {
                        s.close();
                    } catch (JMSException e) {
                        closeFromListener.set(e);
                    }
                }
                seen.add(text + (message.getJMSRedelivered() ? "*" : ""));
                done.countDown();
                if (text.equals("boom") && !message.getJMSRedelivered()) {
                    throw new RuntimeException("first delivery fails on purpose");
                }
            } catch (JMSException e) {
                throw new RuntimeException(e);
            }
        });
        assertThrows(IllegalStateException.class, () -> consumer.receive(10));
        Session ps = c.createSession();
        MessageProducer p = ps.createProducer(q);
        p.send(ps.createTextMessage("one"));
        p.send(ps.createTextMessage("boom"));
        p.send(ps.createTextMessage("two"));
        assertTrue(done.await(10, TimeUnit.SECONDS), seen.toString());
        assertEquals("one", seen.get(0));
        assertTrue(seen.contains("boom") && seen.contains("boom*") && seen.contains("two"), seen.toString());
        assertInstanceOf(IllegalStateException.class, closeFromListener.get(), "a listener must not close its own session");
        s.close();
    }

    // -- selectors -------------------------------------------------------------------------------------
    @Test
    void selectorsSeeTypedPropertiesAndABadSelectorLeavesTheConnectionUp() throws JMSException {
        Connection c = connect();
        Session s = c.createSession();
        Queue q = queue(s);
        MessageProducer p = s.createProducer(q);
        for (int i = 0; i < 6; i++) {
            TextMessage m = s.createTextMessage("n" + i);
            m.setIntProperty("n", i);
            m.setStringProperty("colour", i % 2 == 0 ? "red" : "blue");
            p.send(m);
        }
        InvalidSelectorException bad = assertThrows(InvalidSelectorException.class, () -> s.createConsumer(q, "n >"));
        assertTrue(bad.getMessage().contains("position 3"), bad.getMessage());
        MessageConsumer consumer = s.createConsumer(q, "n >= 2 AND colour = 'red'");
        assertEquals("n >= 2 AND colour = 'red'", consumer.getMessageSelector());
        assertEquals("n2", ((TextMessage) consumer.receive(5000)).getText());
        assertEquals("n4", ((TextMessage) consumer.receive(5000)).getText());
        assertNull(consumer.receive(300));
        consumer.close();
        assertEquals(List.of("n0", "n1", "n3", "n5"), drain(q, 5000));
    }

    // -- topics and subscriptions ------------------------------------------------------------------------
    @Test
    void durableSubscriptionsKeepMessagesWhileAwayAndUnsubscribe() throws JMSException {
        String clientId = "java-durable-" + name;
        Connection c = new PymqConnectionFactory(Broker.url("clientId=" + clientId)).createConnection();
        opened.add(c);
        c.start();
        Session s = c.createSession();
        Topic topic = s.createTopic("java-" + name);
        MessageConsumer durable = s.createDurableConsumer(topic, "sub");
        assertThrows(IllegalStateException.class, () -> s.createDurableConsumer(topic, "sub"), "one active consumer");
        durable.close();
        MessageProducer p = s.createProducer(topic);
        p.send(s.createTextMessage("while away"));
        MessageConsumer back = s.createDurableSubscriber(topic, "sub");
        assertEquals("while away", ((TextMessage) back.receive(5000)).getText());
        assertThrows(IllegalStateException.class, () -> s.unsubscribe("sub"), "its consumer is still open");
        back.close();
        s.unsubscribe("sub");
        InvalidDestinationException unknown = assertThrows(InvalidDestinationException.class, () -> s.unsubscribe("sub"));
        assertTrue(unknown.getMessage().contains("sub"));
        p.send(s.createTextMessage("after"));     // the connection is still up after both refusals
        // without a client id durable names are scoped by the user: a second guest connection sees the
        // first one's active consumer through the admin interface and is refused without losing its connection
        Connection a = connect();
        Connection b = connect();
        Session sa = a.createSession();
        Session sb = b.createSession();
        String shared = "by-user-" + name;
        MessageConsumer held = sa.createDurableConsumer(topic, shared);
        assertThrows(IllegalStateException.class, () -> sb.createDurableConsumer(topic, shared));
        assertThrows(IllegalStateException.class, () -> sb.unsubscribe(shared));
        sb.createProducer(topic).send(sb.createTextMessage("still up"));
        assertEquals("still up", ((TextMessage) held.receive(5000)).getText());
        held.close();
        sb.unsubscribe(shared);
    }

    @Test
    void sharedSubscriptionsSplitMessagesAndNoLocalSkipsOwnMessages() throws JMSException {
        Connection a = connect();
        Connection b = connect();
        Session sa = a.createSession();
        Session sb = b.createSession();
        Topic topic = sa.createTopic("java-" + name);
        MessageConsumer ca = sa.createSharedConsumer(topic, "workers");
        MessageConsumer cb = sb.createSharedConsumer(topic, "workers");
        MessageConsumer durableA = sa.createSharedDurableConsumer(topic, "archive");
        MessageConsumer plainA = sa.createConsumer(topic, null, true);   // no-local
        MessageConsumer plainB = sb.createConsumer(topic);
        MessageProducer p = sa.createProducer(topic);
        for (int i = 0; i < 6; i++) {
            p.send(sa.createTextMessage("w" + i));
        }
        int shared = 0;
        for (MessageConsumer c : List.of(ca, cb)) {
            while (c.receive(500) != null) {
                shared++;
            }
        }
        assertEquals(6, shared, "each message once across the shared subscription");
        int archived = 0;
        while (durableA.receive(500) != null) {
            archived++;
        }
        assertEquals(6, archived);
        assertNull(plainA.receive(300), "no-local: this connection's own messages are skipped");
        assertEquals("w0", ((TextMessage) plainB.receive(5000)).getText());
        durableA.close();
        sa.unsubscribe("archive");
    }

    @Test
    void queueBrowserLooksWithoutTakingAndPagesThroughDeepQueues() throws JMSException {
        Connection c = connect();
        Session s = c.createSession();
        Queue q = queue(s);
        MessageProducer p = s.createProducer(q);
        p.setDeliveryMode(DeliveryMode.NON_PERSISTENT);
        int total = PymqQueueBrowser.PAGE * 2 + 17;
        for (int i = 0; i < total; i++) {
            TextMessage m = s.createTextMessage("b" + i);
            m.setIntProperty("i", i);
            p.send(m);
        }
        QueueBrowser browser = s.createBrowser(q);
        List<String> seen = new ArrayList<>();
        for (Enumeration<?> e = browser.getEnumeration(); e.hasMoreElements(); ) {
            seen.add(((TextMessage) e.nextElement()).getText());
        }
        assertEquals(total, seen.size());
        assertEquals("b0", seen.get(0));
        assertEquals("b" + (total - 1), seen.get(total - 1));
        QueueBrowser even = s.createBrowser(q, "i < 10 AND i / 2 = 2");
        List<String> selected = new ArrayList<>();
        for (Enumeration<?> e = even.getEnumeration(); e.hasMoreElements(); ) {
            selected.add(((TextMessage) e.nextElement()).getText());
        }
        assertEquals(List.of("b4"), selected);
        assertEquals(total, drain(q, 5000).size(), "browsing removed nothing");
    }

    // -- temporary destinations and request/reply ----------------------------------------------------------
    @Test
    void temporaryQueuesCarryRequestReplyWithQueueRequestor() throws Exception {
        QueueConnection server = ((PymqConnectionFactory) factory()).createQueueConnection();
        opened.add(server);
        server.start();
        QueueSession ss = server.createQueueSession(false, Session.AUTO_ACKNOWLEDGE);
        Queue service = ss.createQueue("java-service-" + name);
        MessageConsumer requests = ss.createConsumer(service);
        MessageProducer replies = ss.createProducer(null);
        requests.setMessageListener(m -> {
            try {
                TextMessage answer = ss.createTextMessage("re:" + ((TextMessage) m).getText());
                answer.setJMSCorrelationID(m.getJMSCorrelationID() != null ? m.getJMSCorrelationID() : m.getJMSMessageID());
                replies.send(m.getJMSReplyTo(), answer);
            } catch (JMSException e) {
                throw new RuntimeException(e);
            }
        });
        QueueConnection client = ((PymqConnectionFactory) factory()).createQueueConnection();
        opened.add(client);
        client.start();
        QueueSession cs = client.createQueueSession(false, Session.AUTO_ACKNOWLEDGE);
        QueueRequestor requestor = new QueueRequestor(cs, service);
        TextMessage answer = (TextMessage) requestor.request(cs.createTextMessage("ping"));
        assertEquals("re:ping", answer.getText());

        TemporaryQueue temp = cs.createTemporaryQueue();
        MessageConsumer tempConsumer = cs.createConsumer(temp);
        cs.createProducer(temp).send(cs.createTextMessage("to myself"));
        assertEquals("to myself", ((TextMessage) tempConsumer.receive(5000)).getText());
        assertThrows(IllegalStateException.class, temp::delete, "it still has a consumer");
        tempConsumer.close();
        temp.delete();
        assertThrows(InvalidDestinationException.class, () -> cs.createConsumer(temp));
        assertThrows(InvalidDestinationException.class, () -> ss.createConsumer(cs.createTemporaryQueue()),
                "only the creating connection consumes from a temporary queue");

        // a temporary topic is the broker's /temp-topic/: replies reach it through JMSReplyTo's global name
        TemporaryTopic tt = cs.createTemporaryTopic();
        assertTrue(((PymqDestination) tt).stompName().startsWith("/temp-topic/"), tt.toString());
        MessageConsumer ttc = cs.createConsumer(tt);
        MessageConsumer ttc2 = cs.createConsumer(tt);
        TextMessage request = cs.createTextMessage("to the topic");
        request.setJMSReplyTo(tt);
        cs.createProducer(service).send(request);
        assertEquals("re:to the topic", ((TextMessage) ttc.receive(5000)).getText());
        assertEquals("re:to the topic", ((TextMessage) ttc2.receive(5000)).getText(), "every subscriber gets it");
        assertThrows(InvalidDestinationException.class, () -> ss.createConsumer(cs.createTemporaryTopic()),
                "only the creating connection consumes from a temporary topic");
        assertThrows(InvalidDestinationException.class, () -> cs.createDurableSubscriber(tt, "no"),
                "JMS: no durable subscription to a temporary topic");
        cs.createProducer(tt).send(cs.createTextMessage("still up"));
        assertEquals("still up", ((TextMessage) ttc.receive(5000)).getText(), "the refusals ended nothing");
    }

    // -- failures ------------------------------------------------------------------------------------------
    @Test
    void brokerErrorsMapToJmsExceptionsAndReachTheExceptionListener() throws Exception {
        Connection c = connect();
        CompletableFuture<JMSException> heard = new CompletableFuture<>();
        c.setExceptionListener(heard::complete);
        Session s = c.createSession();
        // a name the broker refuses, sent without the local check (createQueue would refuse it first)
        Queue bad = new PymqQueue("x".repeat(300));
        InvalidDestinationException e = assertThrows(InvalidDestinationException.class,
                () -> s.createProducer(bad).send(s.createTextMessage("x")));
        assertEquals("invalid-destination", e.getErrorCode());
        JMSException listened = heard.get(10, TimeUnit.SECONDS);
        assertEquals("invalid-destination", listened.getErrorCode());
        assertThrows(JMSException.class, () -> s.createProducer(queue(s)).send(s.createTextMessage("x")),
                "the broker closes a connection after an ERROR: later calls fail");
        c.close();
        assertThrows(IllegalStateException.class, c::createSession);
    }

    @Test
    void closeEndsBlockedReceivesAndReturnsUnacknowledgedMessages() throws Exception {
        Connection c = connect();
        Session s = c.createSession(Session.CLIENT_ACKNOWLEDGE);
        Queue q = queue(s);
        s.createProducer(q).send(s.createTextMessage("kept"));
        MessageConsumer consumer = s.createConsumer(q);
        assertEquals("kept", ((TextMessage) consumer.receive(5000)).getText());
        MessageConsumer idle = s.createConsumer(s.createQueue("java-idle-" + name));
        AtomicReference<Object> result = new AtomicReference<>("pending");
        Thread t = new Thread(() -> {
            try {
                result.set(idle.receive());
            } catch (JMSException ex) {
                result.set(ex);
            }
        });
        t.start();
        Thread.sleep(200);
        c.close();
        t.join(10_000);
        assertNull(result.get(), "a receive blocked in a closing connection returns null");
        assertEquals(List.of("kept"), drain(q, 5000));
    }

    @Test
    void contextApiSendsBodiesAndPropertiesAndSharesItsConnection() {
        PymqConnectionFactory cf = (PymqConnectionFactory) factory();
        try (jakarta.jms.JMSContext ctx = cf.createContext()) {
            Queue q = ctx.createQueue("java-" + name);
            jakarta.jms.JMSConsumer consumer = ctx.createConsumer(q);    // auto-start
            ctx.createProducer().setProperty("kind", "text").setPriority(6).setJMSCorrelationID("c-9").send(q, "hello");
            ctx.createProducer().send(q, java.util.Map.of("k", 1L));
            ctx.createProducer().send(q, new byte[] {1, 2, 3});
            Message first = consumer.receive(5000);
            assertEquals("hello", assertInstanceOf(TextMessage.class, first).getBody(String.class));
            assertEquals(6, first.getJMSPriority());
            assertEquals("c-9", first.getJMSCorrelationID());
            assertEquals("text", first.getStringProperty("kind"));
            assertEquals(java.util.Map.of("k", 1L), consumer.receiveBody(java.util.Map.class, 5000));
            assertArrayEquals(new byte[] {1, 2, 3}, consumer.receiveBody(byte[].class, 5000));
            try (jakarta.jms.JMSContext tx = ctx.createContext(jakarta.jms.JMSContext.SESSION_TRANSACTED)) {
                tx.createProducer().send(q, "in tx");
                assertNull(consumer.receive(300));
                tx.commit();
                assertEquals("in tx", consumer.receiveBody(String.class, 5000));
            }
            assertThrows(jakarta.jms.InvalidSelectorRuntimeException.class, () -> ctx.createConsumer(q, "a = "));
            assertThrows(jakarta.jms.JMSRuntimeException.class, () -> ctx.createProducer().send(q, (java.io.Serializable) 5));
        } catch (JMSException e) {
            throw new AssertionError(e);
        }
    }
}
