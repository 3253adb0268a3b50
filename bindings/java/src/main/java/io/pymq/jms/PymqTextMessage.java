package io.pymq.jms;

import jakarta.jms.JMSException;
import jakarta.jms.MessageFormatException;
import jakarta.jms.TextMessage;

import java.nio.charset.StandardCharsets;

/** A TextMessage: {@code content-type: text/plain;charset=utf-8} on the wire. */
public class PymqTextMessage extends PymqMessage implements TextMessage {
    private String text;

    public PymqTextMessage() {
    }

    public PymqTextMessage(String text) {
        this.text = text;
    }

    @Override
    String contentType() {
        return WireFormat.TEXT_TYPE;
    }

    @Override
    byte[] bodyBytes() {
        return text == null ? new byte[0] : text.getBytes(StandardCharsets.UTF_8);
    }

    @Override
    public void setText(String text) throws JMSException {
        checkWritable();
        this.text = text;
    }

    @Override
    public String getText() {
        return text;
    }

    @Override
    public void clearBody() throws JMSException {
        super.clearBody();
        text = null;
    }

    @Override
    public <T> T getBody(Class<T> c) throws JMSException {
        if (text == null) {
            return null;
        }
        if (!c.isAssignableFrom(String.class)) {
            throw new MessageFormatException("a TextMessage body is a String, not a " + c.getName());
        }
        return c.cast(text);
    }

    @Override
    @SuppressWarnings("rawtypes")
    public boolean isBodyAssignableTo(Class c) {
        return text == null || c.isAssignableFrom(String.class);
    }
}
