package io.pymq.jms;

import jakarta.jms.JMSException;

/**
 * {@code commit()} of a failover connection lost its link after the COMMIT went out and before the
 * broker's receipt came back (spec/ha.md §4.5): the broker applied the whole transaction or none of it,
 * and which is not known.  The provider never sends that COMMIT again; messages consumed in it come back
 * redelivered if it was not applied.  Jakarta Messaging has no such type (JTA's heuristic outcomes are the
 * nearest), so it is pymq's, as the Python SDK's TransactionInDoubt is.
 */
public class TransactionInDoubtException extends JMSException {
    private static final long serialVersionUID = 1L;

    public TransactionInDoubtException(String reason, String errorCode) {
        super(reason, errorCode);
    }
}
