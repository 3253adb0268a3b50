package io.pymq.jms;

import io.pymq.testing.Broker;
import jakarta.jms.Connection;
import jakarta.jms.JMSException;
import jakarta.jms.JMSSecurityException;
import jakarta.jms.MessageConsumer;
import jakarta.jms.Queue;
import jakarta.jms.Session;
import jakarta.jms.TextMessage;
import org.junit.jupiter.api.Test;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

/**
 * Virtual hosts (spec/stomp.md section 1) through the provider: the URL's path or the {@code vhost} option
 * (URL or setter) selects one, sent as {@code host:/<vhost>}; the same queue name in two vhosts and in the
 * default vhost is three queues, each with only its own messages; an unknown vhost is refused at connect.
 */
class VhostTest {
    private static List<String> drain(Connection c, String queue) throws JMSException {
        Session s = c.createSession();
        MessageConsumer consumer = s.createConsumer(s.createQueue(queue));
        List<String> out = new ArrayList<>();
        for (jakarta.jms.Message m = consumer.receive(3000); m != null; m = consumer.receive(300)) {
            out.add(((TextMessage) m).getText());
        }
        return out;
    }

    private static void send(Connection c, String queue, String text) throws JMSException {
        Session s = c.createSession();
        Queue q = s.createQueue(queue);
        s.createProducer(q).send(s.createTextMessage(text));
    }

    @Test
    void twoVhostsSameNamedQueuesAreApart() throws Exception {
        Map<String, String> listeners = Broker.startOwn("vhosts:\n  shop: [\"*\"]\n  books: [\"*\"]\n");
        String addr = listeners.get("stomp");
        String queue = "java-vhost-" + UUID.randomUUID().toString().substring(0, 8);
        PymqConnectionFactory bySetter = new PymqConnectionFactory("stomp://" + addr);
        bySetter.setVhost("shop");
        PymqConnectionFactory byPath = new PymqConnectionFactory("stomp://" + addr + "/shop");
        assertEquals("shop", byPath.vhostAt(byPath.brokers().get(0)));
        try (Connection shop = new PymqConnectionFactory("stomp://" + addr + "/shop").createConnection();
             Connection books = new PymqConnectionFactory("failover:(stomp://" + addr + "?vhost=books)").createConnection();
             Connection shopAgain = bySetter.createConnection();
             Connection plain = new PymqConnectionFactory("stomp://" + addr).createConnection()) {
            for (Connection c : List.of(shop, books, shopAgain, plain)) {
                c.start();
            }
            send(shop, queue, "for the shop");
            send(books, queue, "for the books");
            send(plain, queue, "for the default vhost");
            assertEquals(List.of("for the books"), drain(books, queue));
            assertEquals(List.of("for the shop"), drain(shopAgain, queue));
            assertEquals(List.of("for the default vhost"), drain(plain, queue));
        }
        JMSException refused = assertThrows(JMSException.class,
                () -> new PymqConnectionFactory("stomp://" + addr + "/nowhere").createConnection().close());
        assertEquals(true, refused instanceof JMSSecurityException, "an unknown vhost is access-denied: " + refused);
        assertThrows(IllegalArgumentException.class, () -> new PymqConnectionFactory("stomp://" + addr + "/no/such"));
        assertThrows(IllegalArgumentException.class, () -> new PymqConnectionFactory().setVhost("b@d"));
    }
}
