package io.pymq.jms;

import jakarta.jms.BytesMessage;
import jakarta.jms.ConnectionMetaData;
import jakarta.jms.Destination;
import jakarta.jms.ExceptionListener;
import jakarta.jms.IllegalStateException;
import jakarta.jms.IllegalStateRuntimeException;
import jakarta.jms.InvalidClientIDException;
import jakarta.jms.InvalidClientIDRuntimeException;
import jakarta.jms.InvalidDestinationException;
import jakarta.jms.InvalidDestinationRuntimeException;
import jakarta.jms.InvalidSelectorException;
import jakarta.jms.InvalidSelectorRuntimeException;
import jakarta.jms.JMSConsumer;
import jakarta.jms.JMSContext;
import jakarta.jms.JMSException;
import jakarta.jms.JMSProducer;
import jakarta.jms.JMSRuntimeException;
import jakarta.jms.JMSSecurityException;
import jakarta.jms.JMSSecurityRuntimeException;
import jakarta.jms.MapMessage;
import jakarta.jms.Message;
import jakarta.jms.MessageFormatException;
import jakarta.jms.MessageFormatRuntimeException;
import jakarta.jms.MessageNotWriteableException;
import jakarta.jms.MessageNotWriteableRuntimeException;
import jakarta.jms.ObjectMessage;
import jakarta.jms.Queue;
import jakarta.jms.QueueBrowser;
import jakarta.jms.ResourceAllocationException;
import jakarta.jms.ResourceAllocationRuntimeException;
import jakarta.jms.Session;
import jakarta.jms.StreamMessage;
import jakarta.jms.TemporaryQueue;
import jakarta.jms.TemporaryTopic;
import jakarta.jms.TextMessage;
import jakarta.jms.Topic;
import jakarta.jms.TransactionInProgressException;
import jakarta.jms.TransactionInProgressRuntimeException;
import jakarta.jms.TransactionRolledBackException;
import jakarta.jms.TransactionRolledBackRuntimeException;

import java.io.Serializable;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * The simplified API: a JMSContext is a connection (shared by the contexts made from it with
 * {@link #createContext}, closed with the last of them) and one session, created on first use so that
 * {@link #setClientID} can still come first.  With auto-start (the default) creating a consumer starts the
 * connection.  Every JMSException becomes the matching JMSRuntimeException.
 */
public class PymqContext implements JMSContext {
    private final PymqConnection connection;
    private final int sessionMode;
    private final AtomicInteger users;     // contexts sharing the connection
    private PymqSession session;
    private PymqMessageProducer producer;   // the session's one producer without a destination
    private volatile boolean autoStart = true;
    private volatile boolean closed;

    PymqContext(PymqConnection connection, int sessionMode, AtomicInteger users) {
        this.connection = connection;
        this.sessionMode = sessionMode;
        this.users = users;
    }

    static void checkMode(int mode) {
        if (mode < Session.SESSION_TRANSACTED || mode > Session.DUPS_OK_ACKNOWLEDGE) {
            throw new JMSRuntimeException("unknown session mode " + mode);
        }
    }

    /** The JMSRuntimeException for a JMSException (JMS 3.1 §7.1.3 table). */
    static JMSRuntimeException runtime(JMSException e) {
        String m = e.getMessage();
        String c = e.getErrorCode();
        JMSRuntimeException r;
        if (e instanceof InvalidDestinationException) {
            r = new InvalidDestinationRuntimeException(m, c, e);
        } else if (e instanceof InvalidSelectorException) {
            r = new InvalidSelectorRuntimeException(m, c, e);
        } else if (e instanceof InvalidClientIDException) {
            r = new InvalidClientIDRuntimeException(m, c, e);
        } else if (e instanceof IllegalStateException) {
            r = new IllegalStateRuntimeException(m, c, e);
        } else if (e instanceof JMSSecurityException) {
            r = new JMSSecurityRuntimeException(m, c, e);
        } else if (e instanceof MessageNotWriteableException) {
            r = new MessageNotWriteableRuntimeException(m, c, e);
        } else if (e instanceof MessageFormatException) {
            r = new MessageFormatRuntimeException(m, c, e);
        } else if (e instanceof ResourceAllocationException) {
            r = new ResourceAllocationRuntimeException(m, c, e);
        } else if (e instanceof TransactionRolledBackException) {
            r = new TransactionRolledBackRuntimeException(m, c, e);
        } else if (e instanceof TransactionInProgressException) {
            r = new TransactionInProgressRuntimeException(m, c, e);
        } else {
            r = new JMSRuntimeException(m, c, e);
        }
        return r;
    }

    /** Runs a JMS call, turning its JMSException into the runtime one. */
    @FunctionalInterface
    interface Call<T> {
        T run() throws JMSException;
    }

    static <T> T call(Call<T> c) {
        try {
            return c.run();
        } catch (JMSException e) {
            throw runtime(e);
        }
    }

    private void checkOpen() {
        if (closed) {
            throw new IllegalStateRuntimeException("the JMSContext is closed");
        }
    }

    synchronized PymqSession session() {
        checkOpen();
        if (session == null) {
            session = call(() -> connection.newSession(sessionMode));
        }
        return session;
    }

    synchronized PymqMessageProducer producer() {
        if (producer == null) {
            producer = call(() -> session().newProducer(null));
        }
        return producer;
    }

    private void autoStartNow() {
        if (autoStart) {
            call(() -> {
                connection.start();
                return null;
            });
        }
    }

    @Override
    public JMSContext createContext(int sessionMode) {
        checkOpen();
        checkMode(sessionMode);
        users.incrementAndGet();
        return new PymqContext(connection, sessionMode, users);
    }

    @Override
    public JMSProducer createProducer() {
        checkOpen();
        return new PymqJMSProducer(this);
    }

    @Override
    public String getClientID() {
        checkOpen();
        return call(connection::getClientID);
    }

    @Override
    public void setClientID(String clientID) {
        checkOpen();
        call(() -> {
            connection.setClientID(clientID);
            return null;
        });
    }

    @Override
    public ConnectionMetaData getMetaData() {
        checkOpen();
        return call(connection::getMetaData);
    }

    @Override
    public ExceptionListener getExceptionListener() {
        checkOpen();
        return call(connection::getExceptionListener);
    }

    @Override
    public void setExceptionListener(ExceptionListener listener) {
        checkOpen();
        call(() -> {
            connection.setExceptionListener(listener);
            return null;
        });
    }

    @Override
    public void start() {
        checkOpen();
        call(() -> {
            connection.start();
            return null;
        });
    }

    @Override
    public void stop() {
        checkOpen();
        call(() -> {
            connection.stop();
            return null;
        });
    }

    @Override
    public void setAutoStart(boolean autoStart) {
        checkOpen();
        this.autoStart = autoStart;
    }

    @Override
    public boolean getAutoStart() {
        checkOpen();
        return autoStart;
    }

    /** Closes the session; the last context sharing the connection closes it too. */
    @Override
    public void close() {
        if (closed) {
            return;
        }
        call(() -> {
            PymqSession s;
            synchronized (this) {
                s = session;
            }
            if (s != null && s.isDispatcherThread()) {
                throw new IllegalStateException("a message listener must not close its own JMSContext");
            }
            closed = true;
            if (s != null) {
                s.close();
            }
            if (users.decrementAndGet() == 0) {
                connection.close();
            }
            return null;
        });
    }

    @Override
    public BytesMessage createBytesMessage() {
        return call(() -> session().createBytesMessage());
    }

    @Override
    public MapMessage createMapMessage() {
        return call(() -> session().createMapMessage());
    }

    @Override
    public Message createMessage() {
        return call(() -> session().createMessage());
    }

    @Override
    public ObjectMessage createObjectMessage() {
        return call(() -> session().createObjectMessage());
    }

    @Override
    public ObjectMessage createObjectMessage(Serializable object) {
        return call(() -> session().createObjectMessage(object));
    }

    @Override
    public StreamMessage createStreamMessage() {
        return call(() -> session().createStreamMessage());
    }

    @Override
    public TextMessage createTextMessage() {
        return call(() -> session().createTextMessage());
    }

    @Override
    public TextMessage createTextMessage(String text) {
        return call(() -> session().createTextMessage(text));
    }

    @Override
    public boolean getTransacted() {
        checkOpen();
        return sessionMode == Session.SESSION_TRANSACTED;
    }

    @Override
    public int getSessionMode() {
        checkOpen();
        return sessionMode;
    }

    @Override
    public void commit() {
        call(() -> {
            session().commit();
            return null;
        });
    }

    @Override
    public void rollback() {
        call(() -> {
            session().rollback();
            return null;
        });
    }

    @Override
    public void recover() {
        call(() -> {
            session().recover();
            return null;
        });
    }

    private JMSConsumer consumer(Call<jakarta.jms.MessageConsumer> make) {
        PymqJMSConsumer c = new PymqJMSConsumer((PymqMessageConsumer) call(make));
        autoStartNow();
        return c;
    }

    @Override
    public JMSConsumer createConsumer(Destination destination) {
        return consumer(() -> session().createConsumer(destination));
    }

    @Override
    public JMSConsumer createConsumer(Destination destination, String messageSelector) {
        return consumer(() -> session().createConsumer(destination, messageSelector));
    }

    @Override
    public JMSConsumer createConsumer(Destination destination, String messageSelector, boolean noLocal) {
        return consumer(() -> session().createConsumer(destination, messageSelector, noLocal));
    }

    @Override
    public Queue createQueue(String queueName) {
        return call(() -> session().createQueue(queueName));
    }

    @Override
    public Topic createTopic(String topicName) {
        return call(() -> session().createTopic(topicName));
    }

    @Override
    public JMSConsumer createDurableConsumer(Topic topic, String name) {
        return consumer(() -> session().createDurableConsumer(topic, name));
    }

    @Override
    public JMSConsumer createDurableConsumer(Topic topic, String name, String messageSelector, boolean noLocal) {
        return consumer(() -> session().createDurableConsumer(topic, name, messageSelector, noLocal));
    }

    @Override
    public JMSConsumer createSharedDurableConsumer(Topic topic, String name) {
        return consumer(() -> session().createSharedDurableConsumer(topic, name));
    }

    @Override
    public JMSConsumer createSharedDurableConsumer(Topic topic, String name, String messageSelector) {
        return consumer(() -> session().createSharedDurableConsumer(topic, name, messageSelector));
    }

    @Override
    public JMSConsumer createSharedConsumer(Topic topic, String sharedSubscriptionName) {
        return consumer(() -> session().createSharedConsumer(topic, sharedSubscriptionName));
    }

    @Override
    public JMSConsumer createSharedConsumer(Topic topic, String sharedSubscriptionName, String messageSelector) {
        return consumer(() -> session().createSharedConsumer(topic, sharedSubscriptionName, messageSelector));
    }

    @Override
    public QueueBrowser createBrowser(Queue queue) {
        return call(() -> session().createBrowser(queue));
    }

    @Override
    public QueueBrowser createBrowser(Queue queue, String messageSelector) {
        return call(() -> session().createBrowser(queue, messageSelector));
    }

    @Override
    public TemporaryQueue createTemporaryQueue() {
        return call(() -> session().createTemporaryQueue());
    }

    @Override
    public TemporaryTopic createTemporaryTopic() {
        return call(() -> session().createTemporaryTopic());
    }

    @Override
    public void unsubscribe(String name) {
        call(() -> {
            session().unsubscribe(name);
            return null;
        });
    }

    @Override
    public void acknowledge() {
        call(() -> {
            session().acknowledge();
            return null;
        });
    }
}
