package io.pymq.jms;

import com.fasterxml.jackson.databind.JsonNode;
import io.pymq.testing.Broker;
import io.pymq.testing.PythonPeer;
import jakarta.jms.BytesMessage;
import jakarta.jms.Connection;
import jakarta.jms.DeliveryMode;
import jakarta.jms.JMSException;
import jakarta.jms.MapMessage;
import jakarta.jms.Message;
import jakarta.jms.MessageConsumer;
import jakarta.jms.MessageProducer;
import jakarta.jms.Queue;
import jakarta.jms.QueueConnection;
import jakarta.jms.QueueRequestor;
import jakarta.jms.QueueSession;
import jakarta.jms.Session;
import jakarta.jms.TextMessage;
import jakarta.jms.Topic;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestInfo;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;

import static io.pymq.testing.PythonPeer.request;
import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Java (this provider) and Python (the pymq SDK, tests/bindings/python_peer.py) through one real broker,
 * both ways: queues, topics, durable subscriptions, transactions, request/reply, selectors, and typed
 * properties that keep their types across the languages.
 */
class InteropTest {
    private final List<Connection> opened = new ArrayList<>();
    private String name;

    @BeforeEach
    void name(TestInfo info) {
        name = info.getTestMethod().map(m -> m.getName()).orElse("t") + "-" + UUID.randomUUID().toString().substring(0, 8);
    }

    @AfterEach
    void closeAll() throws JMSException {
        for (Connection c : opened) {
            c.close();
        }
    }

    private Connection connect(String query) throws JMSException {
        Connection c = new PymqConnectionFactory(query == null ? Broker.url() : Broker.url(query)).createConnection();
        opened.add(c);
        c.start();
        return c;
    }

    private static Map<String, Object> typed(String type, Object value) {
        Map<String, Object> m = new LinkedHashMap<>();
        m.put("type", type);
        m.put("value", value);
        return m;
    }

    private static Map<String, Object> message(Object... pairs) {
        Map<String, Object> m = new LinkedHashMap<>();
        for (int i = 0; i < pairs.length; i += 2) {
            m.put((String) pairs[i], pairs[i + 1]);
        }
        return m;
    }

    /** Waits until the broker reports a subscription on {@code topic} (a peer that subscribed). */
    private static void awaitSubscriber(Connection c, Topic topic) throws Exception {
        AdminChannel admin = ((PymqConnection) c).admin();
        for (int i = 0; i < 200; i++) {
            for (AdminChannel.JsonValue t : admin.call("list-topics", "{}").items()) {
                if (("/topic/" + topic.getTopicName()).equals(t.get("destination").value) && !t.get("subscriptions").items().isEmpty()) {
                    return;
                }
            }
            Thread.sleep(50);
        }
        throw new AssertionError("the Python peer never subscribed to " + topic);
    }

    @Test
    void javaToPythonQueueKeepsBodiesHeadersAndPropertyTypes() throws JMSException {
        Session s = connect(null).createSession();
        Queue q = s.createQueue("interop-" + name);
        MessageProducer p = s.createProducer(q);
        TextMessage t = s.createTextMessage("from java ✓");
        t.setIntProperty("count", 42);
        t.setLongProperty("big", 9_007_199_254_740_993L);
        t.setDoubleProperty("ratio", 0.1);
        t.setFloatProperty("f", 2.5f);
        t.setBooleanProperty("flag", true);
        t.setStringProperty("label", "x=1,y:2");
        t.setJMSCorrelationID("corr-7");
        t.setJMSType("order");
        t.setJMSReplyTo(s.createQueue("interop-replies"));
        t.setStringProperty("JMSXGroupID", "g-9");
        p.send(t, DeliveryMode.PERSISTENT, 6, 0);
        BytesMessage b = s.createBytesMessage();
        b.writeBytes(new byte[] {0, 1, (byte) 0xfe, (byte) 0xff});
        p.send(b);
        MapMessage m = s.createMapMessage();
        m.setString("sku", "A-1");
        m.setLong("qty", 3);
        m.setDouble("price", 9.5);
        m.setBoolean("gift", true);
        m.setBytes("blob", new byte[] {9, 8});
        m.setObject("none", null);
        p.send(m, DeliveryMode.NON_PERSISTENT, 4, 0);

        JsonNode got = PythonPeer.run(request("op", "receive", "destination", "/queue/" + q.getQueueName(), "count", 3));
        JsonNode messages = got.get("messages");
        assertEquals(3, messages.size(), got.toString());
        JsonNode text = messages.get(0);
        assertEquals("text", text.get("kind").asText());
        assertEquals("from java ✓", text.get("body").asText());
        JsonNode props = text.get("properties");
        assertEquals("int", props.get("count").get("type").asText());
        assertEquals(42, props.get("count").get("value").asInt());
        assertEquals(9_007_199_254_740_993L, props.get("big").get("value").asLong());
        assertEquals("float", props.get("ratio").get("type").asText());
        assertEquals(0.1, props.get("ratio").get("value").asDouble());
        assertEquals(2.5, props.get("f").get("value").asDouble());
        assertEquals("bool", props.get("flag").get("type").asText());
        assertTrue(props.get("flag").get("value").asBoolean());
        assertEquals("x=1,y:2", props.get("label").get("value").asText());
        assertEquals("float", props.get("f").get("type").asText());
        assertFalse(props.has("pymq-jms-types"), "Java's type header is no property for Python: " + props);
        assertEquals("corr-7", text.get("correlation_id").asText());
        assertEquals("order", text.get("type").asText());
        assertEquals("/queue/interop-replies", text.get("reply_to").asText());
        assertEquals(6, text.get("priority").asInt());
        assertEquals("g-9", text.get("group_id").asText());
        assertEquals(t.getJMSMessageID(), text.get("message_id").asText());
        JsonNode bytes = messages.get(1);
        assertEquals("bytes", bytes.get("kind").asText());
        assertEquals("0001feff", bytes.get("body").asText());
        JsonNode map = messages.get(2);
        assertEquals("map", map.get("kind").asText());
        assertFalse(map.get("persistent").asBoolean());
        JsonNode body = map.get("body");
        assertEquals("A-1", body.get("sku").get("value").asText());
        assertEquals("int", body.get("qty").get("type").asText());
        assertEquals("float", body.get("price").get("type").asText());
        assertEquals("bool", body.get("gift").get("type").asText());
        assertEquals("0908", body.get("blob").get("value").asText());
        assertEquals("null", body.get("none").get("type").asText());
    }

    @Test
    void pythonToJavaQueueGivesJmsTypesBack() throws JMSException {
        Session s = connect(null).createSession();
        Queue q = s.createQueue("interop-" + name);
        Map<String, Object> props = new LinkedHashMap<>();
        props.put("count", typed("int", 7));
        props.put("ratio", typed("float", 0.25));
        props.put("flag", typed("bool", false));
        props.put("label", typed("string", "plain"));
        Map<String, Object> mapBody = new LinkedHashMap<>();
        mapBody.put("qty", typed("int", 3));
        mapBody.put("price", typed("float", 9.5));
        mapBody.put("blob", typed("bytes", "00ff"));
        mapBody.put("name", typed("string", "x"));
        PythonPeer.run(request("op", "send", "destination", "/queue/" + q.getQueueName(), "messages", List.of(
                message("kind", "text", "body", "from python", "properties", props, "correlation_id", "c-1",
                        "type", "t", "priority", 8, "group_id", "g-1"),
                message("kind", "bytes", "body", "00010203"),
                message("kind", "map", "body", mapBody))));
        MessageConsumer consumer = s.createConsumer(q);
        TextMessage t = (TextMessage) consumer.receive(5000);
        assertEquals("from python", t.getText());
        assertEquals(7L, t.getObjectProperty("count"));
        assertEquals(7, t.getIntProperty("count"));
        assertEquals(0.25, t.getObjectProperty("ratio"));
        assertEquals(Boolean.FALSE, t.getObjectProperty("flag"));
        assertEquals("plain", t.getObjectProperty("label"));
        assertEquals("c-1", t.getJMSCorrelationID());
        assertEquals("t", t.getJMSType());
        assertEquals(8, t.getJMSPriority());
        assertEquals("g-1", t.getStringProperty("JMSXGroupID"));
        assertNotNull(t.getJMSMessageID());
        BytesMessage b = (BytesMessage) consumer.receive(5000);
        assertEquals(4, b.getBodyLength());
        assertEquals(0x00010203, b.readInt());
        MapMessage m = (MapMessage) consumer.receive(5000);
        assertEquals(3L, m.getObject("qty"));
        assertEquals(9.5, m.getObject("price"));
        assertArrayEquals(new byte[] {0, (byte) 0xff}, m.getBytes("blob"));
        assertEquals("x", m.getString("name"));
    }

    @Test
    void topicsBothWays() throws Exception {
        Connection c = connect(null);
        Session s = c.createSession();
        Topic topic = s.createTopic("interop-" + name);
        MessageConsumer javaSide = s.createConsumer(topic);
        CompletableFuture<JsonNode> python = PythonPeer.start(request("op", "receive", "destination",
                "/topic/" + topic.getTopicName(), "count", 2, "timeout", 20));
        awaitSubscriber(c, topic);
        // one subscription is Java's own: wait for the second (Python's)
        AdminChannel admin = ((PymqConnection) c).admin();
        for (int i = 0; i < 200; i++) {
            int subs = 0;
            for (AdminChannel.JsonValue t : admin.call("list-topics", "{}").items()) {
                if (("/topic/" + topic.getTopicName()).equals(t.get("destination").value)) {
                    subs = t.get("subscriptions").items().size();
                }
            }
            if (subs >= 2) {
                break;
            }
            Thread.sleep(50);
        }
        MessageProducer p = s.createProducer(topic);
        p.send(s.createTextMessage("j1"));
        p.send(s.createTextMessage("j2"));
        JsonNode got = python.join().get("messages");
        assertEquals(2, got.size());
        assertEquals("j1", got.get(0).get("body").asText());
        assertEquals("/topic/" + topic.getTopicName(), got.get(0).get("destination").asText());
        assertEquals("j1", ((TextMessage) javaSide.receive(5000)).getText());
        assertEquals("j2", ((TextMessage) javaSide.receive(5000)).getText());
        PythonPeer.run(request("op", "send", "destination", "/topic/" + topic.getTopicName(),
                "messages", List.of(message("kind", "text", "body", "p1"))));
        assertEquals("p1", ((TextMessage) javaSide.receive(5000)).getText());
    }

    @Test
    void durableSubscriptionsAcrossLanguages() throws JMSException {
        String topicName = "interop-" + name;
        String dest = "/topic/" + topicName;
        // Python's durable subscription receives what Java publishes while it is away
        String pyClient = "py-" + name;
        PythonPeer.run(request("op", "receive", "client_id", pyClient, "destination", dest, "durable", "audit",
                "count", 1, "timeout", 0.2));
        Session s = connect(null).createSession();
        Topic topic = s.createTopic(topicName);
        // Java's durable subscription (its own client id) also exists before the publishing
        String javaClient = "java-" + name;
        Connection jc = connect("clientId=" + javaClient);
        jc.createSession().createDurableConsumer(topic, "audit").close();
        MessageProducer p = s.createProducer(topic);
        TextMessage sent = s.createTextMessage("while away");
        sent.setIntProperty("n", 1);
        p.send(sent);
        JsonNode got = PythonPeer.run(request("op", "receive", "client_id", pyClient, "destination", dest, "durable",
                "audit", "count", 1));
        assertEquals("while away", got.get("messages").get(0).get("body").asText());
        assertEquals(1, got.get("messages").get(0).get("properties").get("n").get("value").asInt());
        PythonPeer.run(request("op", "unsubscribe", "client_id", pyClient, "name", "audit"));
        // and Java's durable subscription gets what Python publishes while Java is away
        PythonPeer.run(request("op", "send", "destination", dest, "messages", List.of(message("kind", "text", "body", "py pub"))));
        Session js = jc.createSession();
        MessageConsumer back = js.createDurableConsumer(topic, "audit");
        assertEquals("while away", ((TextMessage) back.receive(5000)).getText());
        assertEquals("py pub", ((TextMessage) back.receive(5000)).getText());
        back.close();
        js.unsubscribe("audit");
    }

    @Test
    void transactionsAcrossLanguages() throws JMSException {
        Connection c = connect(null);
        Session tx = c.createSession(Session.SESSION_TRANSACTED);
        Queue q = tx.createQueue("interop-" + name);
        String dest = "/queue/" + q.getQueueName();
        MessageProducer p = tx.createProducer(q);
        p.send(tx.createTextMessage("rolled back"));
        tx.rollback();
        p.send(tx.createTextMessage("committed"));
        tx.commit();
        // Python takes it in a transaction, rolls back (redelivery), then takes it again and commits
        JsonNode got = PythonPeer.run(request("op", "receive", "destination", dest, "transacted", true,
                "rollback_first", true, "count", 5, "timeout", 5, "more_timeout", 0.5));
        assertEquals(1, got.get("messages").size(), got.toString());
        assertEquals("committed", got.get("messages").get(0).get("body").asText());
        assertTrue(got.get("messages").get(0).get("redelivered").asBoolean());
        assertEquals(2, got.get("messages").get(0).get("delivery_count").asInt());
        // Python's rolled-back transaction leaves nothing; its committed one arrives whole
        PythonPeer.run(request("op", "send", "destination", dest, "transacted", true, "rollback", true,
                "messages", List.of(message("body", "py rolled back"))));
        PythonPeer.run(request("op", "send", "destination", dest, "transacted", true,
                "messages", List.of(message("body", "py a"), message("body", "py b"))));
        MessageConsumer consumer = tx.createConsumer(q);
        assertEquals("py a", ((TextMessage) consumer.receive(5000)).getText());
        assertEquals("py b", ((TextMessage) consumer.receive(5000)).getText());
        assertNull(consumer.receive(300));
        tx.commit();
    }

    @Test
    void requestReplyBothWays() throws Exception {
        // Java asks, Python answers (its reply goes to Java's temporary queue by the broker's global name)
        Session s = connect(null).createSession();
        String service = "interop-svc-" + name;
        CompletableFuture<JsonNode> server = PythonPeer.start(request("op", "serve", "queue", "/queue/" + service,
                "count", 1, "timeout", 20));
        QueueConnection qc = new PymqConnectionFactory(Broker.url()).createQueueConnection();
        opened.add(qc);
        qc.start();
        QueueSession qs = qc.createQueueSession(false, Session.AUTO_ACKNOWLEDGE);
        QueueRequestor requestor = new QueueRequestor(qs, qs.createQueue(service));
        TextMessage answer = (TextMessage) requestor.request(qs.createTextMessage("ping"));
        assertEquals("re:ping", answer.getText());
        assertEquals(1, server.join().get("served").asInt());
        // Python asks, Java answers
        Queue javaService = s.createQueue("interop-jsvc-" + name);
        MessageConsumer requests = s.createConsumer(javaService);
        MessageProducer replies = s.createProducer(null);
        CompletableFuture<JsonNode> asked = PythonPeer.start(request("op", "request", "queue", "/queue/" + javaService.getQueueName(),
                "message", message("kind", "text", "body", "hello")));
        Message req = requests.receive(20_000);
        assertNotNull(req, "the Python request");
        assertTrue(req.getJMSReplyTo() instanceof jakarta.jms.TemporaryQueue, "the reply-to is a temporary queue");
        TextMessage reply = s.createTextMessage("re:" + ((TextMessage) req).getText());
        reply.setJMSCorrelationID(req.getJMSCorrelationID());
        replies.send(req.getJMSReplyTo(), reply);
        assertEquals("re:hello", asked.join().get("message").get("body").asText());
    }

    @Test
    void selectorsOnTypedPropertiesAcrossLanguages() throws JMSException {
        Session s = connect(null).createSession();
        Queue q = s.createQueue("interop-" + name);
        String dest = "/queue/" + q.getQueueName();
        MessageProducer p = s.createProducer(q);
        for (int i = 0; i < 4; i++) {
            TextMessage m = s.createTextMessage("j" + i);
            m.setIntProperty("n", i);
            m.setDoubleProperty("w", i / 2.0);
            m.setBooleanProperty("even", i % 2 == 0);
            p.send(m);
        }
        // the broker compares typed properties as numbers and booleans, not strings
        JsonNode got = PythonPeer.run(request("op", "receive", "destination", dest, "selector",
                "n > 1 AND w >= 1.0 AND even = TRUE", "count", 4, "timeout", 5, "more_timeout", 0.5));
        assertEquals(1, got.get("messages").size(), got.toString());
        assertEquals("j2", got.get("messages").get(0).get("body").asText());
        Map<String, Object> props = new HashMap<>();
        props.put("n", typed("int", 10));
        Map<String, Object> props2 = new HashMap<>();
        props2.put("n", typed("int", 2));
        PythonPeer.run(request("op", "send", "destination", dest, "messages", List.of(
                message("body", "p10", "properties", props), message("body", "p2", "properties", props2))));
        MessageConsumer consumer = s.createConsumer(q, "n >= 9");
        assertEquals("p10", ((TextMessage) consumer.receive(5000)).getText());
        assertNull(consumer.receive(300));
    }
}
