package io.pymq.jms;

import jakarta.jms.IllegalStateException;
import jakarta.jms.JMSException;
import jakarta.jms.TemporaryQueue;

/**
 * A temporary queue (spec/stomp.md §3): it lives as long as the connection that made it, and only that
 * connection consumes from it.  Its creator knows it as {@code /temp-queue/<name>}; in a message's
 * JMSReplyTo the broker rewrites that to the global {@code /temp-queue/tmp.<connection>.<name>}, which any
 * connection may send to.  {@link #delete()} drops it on the broker with the messages it holds (refused
 * while a consumer of this connection reads it); otherwise the broker drops it with its connection.
 */
public class PymqTemporaryQueue extends PymqQueue implements TemporaryQueue {
    private static final long serialVersionUID = 1L;

    private final transient PymqConnection owner;
    private volatile boolean deleted;

    PymqTemporaryQueue(String name, PymqConnection owner) {
        super(name);
        this.owner = owner;
    }

    @Override
    String prefix() {
        return TEMP_QUEUE_PREFIX;
    }

    /** The connection that created this queue, or null for one named in a received message. */
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
