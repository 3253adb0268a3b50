package io.pymq.jms;

import jakarta.jms.IllegalStateException;
import jakarta.jms.JMSException;
import jakarta.jms.TemporaryTopic;

/**
 * A temporary topic (spec/stomp.md §3): {@code /temp-topic/<name>}, living as long as the connection that
 * made it; only that connection subscribes to it (the broker refuses any other), and a durable
 * subscription to it is refused here.  In a message's JMSReplyTo the broker rewrites it to the global
 * {@code /temp-topic/tmp.<connection>.<name>}, which any connection may publish to.
 */
public class PymqTemporaryTopic extends PymqTopic implements TemporaryTopic {
    private static final long serialVersionUID = 1L;

    private final transient PymqConnection owner;
    private volatile boolean deleted;

    PymqTemporaryTopic(String name, PymqConnection owner) {
        super(name);
        this.owner = owner;
    }

    @Override
    String prefix() {
        return TEMP_TOPIC_PREFIX;
    }

    PymqConnection owner() {
        return owner;
    }

    boolean deleted() {
        return deleted;
    }

    @Override
    public void delete() throws JMSException {
        if (owner == null) {
            throw new IllegalStateException("only the connection that created " + stompName() + " can delete it");
        }
        if (deleted) {
            return;
        }
        owner.deleteTemporary(this);
        deleted = true;
    }
}
