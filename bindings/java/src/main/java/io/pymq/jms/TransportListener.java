package io.pymq.jms;

/**
 * Hears a failover connection (spec/ha.md §4) lose its broker and get one back, as ActiveMQ's
 * {@code TransportListener} does: {@link #transportInterrupted()} when the link is lost and the provider
 * starts reconnecting, {@link #transportResumed()} once it is connected again with every subscription made
 * again and the unreceipted sends re-sent.  Only when every attempt is spent does the connection close and
 * its ExceptionListener hear why.  Called on a thread of the provider's, one event at a time, in order; a
 * listener should return promptly.  Register it with {@link PymqConnection#addTransportListener} or
 * {@link PymqConnectionFactory#setTransportListener}.
 */
public interface TransportListener {
    /** The connection lost its broker and is reconnecting (calls wait meanwhile). */
    default void transportInterrupted() {
    }

    /** The connection is open again, on the broker the provider reached. */
    default void transportResumed() {
    }

    /**
     * Heard just before {@link #transportResumed()} when the new link could not re-claim the lost link's
     * temporary names (spec/ha.md section 4.7: the broker refused the token, {@code why}, or gave none): these
     * temporary queues and topics of the connection have new global names, so a reply addressed to an old one
     * (a {@code JMSReplyTo} sent before the loss) does not reach them; the application may ask again.  Not
     * heard when the names were kept (the provider offers the broker's token at every reconnection).
     */
    default void temporariesRenamed(java.util.Set<jakarta.jms.Destination> temporaries, String why) {
    }
}
