package io.pymq.jms;

import jakarta.jms.Topic;

/** A topic ({@code /topic/<name>}). */
public class PymqTopic extends PymqDestination implements Topic {
    private static final long serialVersionUID = 1L;

    /** A topic by name, without checking it (use {@code Session.createTopic} for a checked one). */
    public PymqTopic(String name) {
        super(name);
    }

    @Override
    String prefix() {
        return TOPIC_PREFIX;
    }

    @Override
    public String getTopicName() {
        return name();
    }
}
