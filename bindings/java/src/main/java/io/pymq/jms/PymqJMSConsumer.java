package io.pymq.jms;

import jakarta.jms.JMSConsumer;
import jakarta.jms.Message;
import jakarta.jms.MessageListener;

/** The simplified API's consumer: a {@link PymqMessageConsumer} whose exceptions are runtime ones. */
public class PymqJMSConsumer implements JMSConsumer {
    private final PymqMessageConsumer consumer;

    PymqJMSConsumer(PymqMessageConsumer consumer) {
        this.consumer = consumer;
    }

    @Override
    public String getMessageSelector() {
        return PymqContext.call(consumer::getMessageSelector);
    }

    @Override
    public MessageListener getMessageListener() {
        return PymqContext.call(consumer::getMessageListener);
    }

    @Override
    public void setMessageListener(MessageListener listener) {
        PymqContext.call(() -> {
            consumer.setMessageListener(listener);
            return null;
        });
    }

    @Override
    public Message receive() {
        return PymqContext.call(consumer::receive);
    }

    @Override
    public Message receive(long timeout) {
        return PymqContext.call(() -> consumer.receive(timeout));
    }

    @Override
    public Message receiveNoWait() {
        return PymqContext.call(consumer::receiveNoWait);
    }

    @Override
    public void close() {
        PymqContext.call(() -> {
            consumer.close();
            return null;
        });
    }

    @Override
    public <T> T receiveBody(Class<T> c) {
        return body(receive(), c);
    }

    @Override
    public <T> T receiveBody(Class<T> c, long timeout) {
        return body(receive(timeout), c);
    }

    @Override
    public <T> T receiveBodyNoWait(Class<T> c) {
        return body(receiveNoWait(), c);
    }

    private static <T> T body(Message m, Class<T> c) {
        return m == null ? null : PymqContext.call(() -> m.getBody(c));
    }
}
