package io.pymq.jms;

import jakarta.jms.IllegalStateException;
import jakarta.jms.JMSException;
import jakarta.jms.TemporaryTopic;

/**
 * A temporary topic.  The broker has no temporary topics, so this is an ordinary topic with an
 * unguessable name ({@code /topic/pymq-tmp.<128 random bits>}): private by obscurity, not by access
 * control, and it leaves no state on the broker once its subscriptions end.  Only the creating connection
 * may subscribe to it through this provider.
 */
public class PymqTemporaryTopic extends PymqTopic implements TemporaryTopic {
    private static final long serialVersionUID = 1L;

    private final transient PymqConnection owner;
    private volatile boolean deleted;

    PymqTemporaryTopic(String name, PymqConnection owner) {
        super(name);
        this.owner = owner;
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
        owner.deleteTemporary(this);
        deleted = true;
    }
}
