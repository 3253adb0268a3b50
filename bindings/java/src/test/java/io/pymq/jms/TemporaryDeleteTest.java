package io.pymq.jms;

import io.pymq.testing.Broker;
import jakarta.jms.Connection;
import jakarta.jms.IllegalStateException;
import jakarta.jms.InvalidDestinationException;
import jakarta.jms.JMSException;
import jakarta.jms.Message;
import jakarta.jms.MessageConsumer;
import jakarta.jms.MessageProducer;
import jakarta.jms.Queue;
import jakarta.jms.Session;
import jakarta.jms.TemporaryQueue;
import jakarta.jms.TemporaryTopic;
import jakarta.jms.TextMessage;
import org.junit.jupiter.api.Test;

import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * TemporaryQueue.delete() and TemporaryTopic.delete() (issue 27.6, spec/stomp.md §3): refused while this
 * connection consumes from it (JMS), and otherwise the broker drops it with its messages, so a reply to its
 * global name is refused afterwards.
 */
class TemporaryDeleteTest {
    @Test
    void deleteIsRefusedWhileConsumedAndThenDropsTheDestinationOnTheBroker() throws Exception {
        PymqConnectionFactory cf = new PymqConnectionFactory(Broker.url());
        try (Connection owner = cf.createConnection(); Connection replier = cf.createConnection();
             Connection late = cf.createConnection()) {
            owner.start();
            replier.start();
            Session os = owner.createSession(Session.CLIENT_ACKNOWLEDGE);
            Session rs = replier.createSession();
            Queue service = rs.createQueue("java-temp-delete-" + UUID.randomUUID());
            MessageConsumer requests = rs.createConsumer(service);

            TemporaryQueue temp = os.createTemporaryQueue();
            MessageConsumer reader = os.createConsumer(temp);
            TextMessage request = os.createTextMessage("reply to me");
            request.setJMSReplyTo(temp);
            os.createProducer(service).send(request);
            Message got = requests.receive(5000);
            assertNotNull(got);
            jakarta.jms.Destination global = got.getJMSReplyTo();
            assertTrue(((PymqDestination) global).stompName().startsWith("/temp-queue/tmp."), global.toString());
            MessageProducer replies = rs.createProducer(null);
            replies.send(global, rs.createTextMessage("one"));
            assertEquals("one", ((TextMessage) reader.receive(5000)).getText());

            assertThrows(IllegalStateException.class, temp::delete, "it has an open consumer");
            reader.close();
            assertThrows(IllegalStateException.class, temp::delete,
                    "its closed consumer's message is not acknowledged yet: the subscription is still there");
            os.recover();      // the closed consumer's subscription ends with the session's next recover
            replies.send(global, rs.createTextMessage("dropped with the queue"));
            temp.delete();
            temp.delete();     // again: nothing more to do
            assertThrows(InvalidDestinationException.class, () -> os.createConsumer(temp), "a deleted one is not used again");
            assertThrows(InvalidDestinationException.class, () -> os.createProducer(temp).send(os.createTextMessage("x")));

            // the broker dropped it: a reply to its global name is refused (and ends that connection)
            Session ls = late.createSession();
            JMSException refused = assertThrows(JMSException.class,
                    () -> ls.createProducer(global).send(ls.createTextMessage("too late")));
            assertTrue(refused instanceof InvalidDestinationException || "unknown-destination".equals(refused.getErrorCode()),
                    refused + " " + refused.getErrorCode());

            TemporaryTopic topic = os.createTemporaryTopic();
            MessageConsumer topicReader = os.createConsumer(topic);
            assertThrows(IllegalStateException.class, topic::delete);
            topicReader.close();
            topic.delete();
            assertThrows(InvalidDestinationException.class, () -> os.createConsumer(topic));
            // the owner is unharmed
            Queue q = os.createQueue("java-temp-after-" + UUID.randomUUID());
            os.createProducer(q).send(os.createTextMessage("still up"));
            assertEquals("still up", ((TextMessage) os.createConsumer(q).receive(5000)).getText());
        }
    }
}
