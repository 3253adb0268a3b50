package io.pymq.jms;

import io.pymq.testing.Broker;
import jakarta.jms.Connection;
import jakarta.jms.Destination;
import jakarta.jms.InvalidDestinationException;
import jakarta.jms.JMSException;
import jakarta.jms.Message;
import jakarta.jms.MessageConsumer;
import jakarta.jms.Queue;
import jakarta.jms.Session;
import jakarta.jms.TemporaryQueue;
import jakarta.jms.TextMessage;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

import java.nio.file.Path;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.UUID;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * Temporary destinations across a takeover (spec/ha.md section 4.7): the live of a real pair is killed with
 * SIGKILL; the requester's reconnection offers the re-claim token of the lost link's CONNECTED (signed with the
 * key in the shared store, so the backup verifies it), its temporary queue keeps its global name, and the
 * reply the responder sends to the old JMSReplyTo afterwards arrives; no temporariesRenamed is heard.  A second
 * requester whose token was forged (another mac for the same names) is refused: its listener hears
 * temporariesRenamed ("does not verify") naming its temporary queue, and nothing was made under its old name
 * (a send there is refused as an invalid destination).
 */
class TemporaryReclaimTest {
    /** Sends a question to {@code service} with {@code JMSReplyTo} {@code replies}; the consumer of the replies. */
    private static MessageConsumer ask(Connection c, Queue service, TemporaryQueue replies) throws JMSException {
        Session s = c.createSession();
        MessageConsumer answered = s.createConsumer(replies);
        TextMessage question = s.createTextMessage("question");
        question.setJMSReplyTo(replies);
        s.createProducer(service).send(question);
        return answered;
    }

    @Test
    void aReplyToATemporaryQueueArrivesAcrossAKill9OfTheLive(@TempDir Path dir) throws Exception {
        FailoverTest.Pair pair = FailoverTest.Pair.start(dir);
        Broker.Own a = pair.a();
        Broker.Own b = pair.b();
        FailoverTest.Heard requesterHeard = new FailoverTest.Heard();
        FailoverTest.Heard forgerHeard = new FailoverTest.Heard();
        PymqConnectionFactory cf = new PymqConnectionFactory(pair.url());
        try (PymqConnection requester = (PymqConnection) cf.createConnection();
             PymqConnection forger = (PymqConnection) cf.createConnection();
             Connection responder = cf.createConnection()) {
            requester.addTransportListener(requesterHeard);
            forger.addTransportListener(forgerHeard);
            for (Connection c : List.of(requester, forger, responder)) {
                c.start();
            }
            Queue service = responder.createSession().createQueue("svc-" + UUID.randomUUID().toString().substring(0, 8));
            TemporaryQueue answers = requester.createSession().createTemporaryQueue();
            MessageConsumer answered = ask(requester, service, answers);
            TemporaryQueue forgedAnswers = forger.createSession().createTemporaryQueue();
            MessageConsumer forgedAnswered = ask(forger, service, forgedAnswers);
            Session ss = responder.createSession();
            MessageConsumer requests = ss.createConsumer(service);
            Message first = requests.receive(10_000);
            Message second = requests.receive(10_000);
            assertNotNull(first);
            assertNotNull(second);
            Destination replyTo = first.getJMSReplyTo();
            Destination forgedReplyTo = second.getJMSReplyTo();
            assertNotEquals(replyTo.toString(), forgedReplyTo.toString());
            String token = requester.reclaimTokenForTests();
            String theirs = forger.reclaimTokenForTests();
            assertNotNull(token, "the broker gave a pymq-reclaim-token");
            assertNotNull(theirs);
            char last = theirs.charAt(theirs.length() - 1);
            forger.reclaimTokenForTests(theirs.substring(0, theirs.length() - 1) + (last == 'A' ? 'B' : 'A'));

            a.kill();
            b.awaitLive(60);
            FailoverTest.await(() -> requesterHeard.events.contains("resumed") && forgerHeard.events.contains("resumed"),
                    "both requesters resumed");
            assertEquals(List.of("interrupted", "resumed"), requesterHeard.events, "the requester's names were kept");
            assertEquals(List.of("interrupted", "renamed", "resumed"), forgerHeard.events);
            Map.Entry<Set<Destination>, String> renamed = forgerHeard.renamed.entrySet().iterator().next();
            assertEquals(Set.of(forgedAnswers), renamed.getKey());
            assertTrue(renamed.getValue().contains("does not verify"), renamed.getValue());
            assertEquals(token, requester.reclaimTokenForTests(), "the same names: the same token for the next loss");

            ss.createProducer(replyTo).send(ss.createTextMessage("answer"));
            Message got = answered.receive(10_000);
            assertNotNull(got, "the reply to the old global name arrived");
            assertEquals("answer", ((TextMessage) got).getText());
            JMSException refused = assertThrows(JMSException.class,
                    () -> ss.createProducer(forgedReplyTo).send(ss.createTextMessage("to the forged names")));
            assertTrue(refused instanceof InvalidDestinationException
                    || "unknown-destination".equals(refused.getErrorCode()), refused.toString());
            assertNull(forgedAnswered.receive(300));
        } finally {
            a.kill();
            b.kill();
        }
    }
}
