package io.pymq.jms;

import jakarta.jms.Queue;

/** A queue ({@code /queue/<name>}). */
public class PymqQueue extends PymqDestination implements Queue {
    private static final long serialVersionUID = 1L;

    /** A queue by name, without checking it (use {@code Session.createQueue} for a checked one). */
    public PymqQueue(String name) {
        super(name);
    }

    @Override
    String prefix() {
        return QUEUE_PREFIX;
    }

    @Override
    public String getQueueName() {
        return name();
    }
}
