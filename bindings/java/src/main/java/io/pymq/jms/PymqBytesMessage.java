package io.pymq.jms;

import jakarta.jms.BytesMessage;
import jakarta.jms.JMSException;
import jakarta.jms.MessageEOFException;
import jakarta.jms.MessageFormatException;
import jakarta.jms.MessageNotReadableException;

import java.io.ByteArrayInputStream;
import java.io.ByteArrayOutputStream;
import java.io.DataInputStream;
import java.io.DataOutputStream;
import java.io.EOFException;
import java.io.IOException;
import java.util.Arrays;

/**
 * A BytesMessage: {@code application/octet-stream} on the wire, the body exactly the bytes written.
 * Typed writes use Java's {@link DataOutputStream} encoding (big-endian, modified UTF-8 for
 * {@code writeUTF}), as JMS specifies; a reader in another language sees those raw bytes.
 */
public class PymqBytesMessage extends PymqMessage implements BytesMessage {
    private ByteArrayOutputStream written = new ByteArrayOutputStream();
    private DataOutputStream out = new DataOutputStream(written);
    private byte[] data;             // the body in read mode
    private DataInputStream in;

    public PymqBytesMessage() {
    }

    /** A received message, or one made from bytes: in read mode. */
    PymqBytesMessage(byte[] body) {
        this.data = body;
        this.in = new DataInputStream(new ByteArrayInputStream(body));
        this.written = null;
        this.out = null;
    }

    @Override
    byte[] bodyBytes() {
        return data != null ? data.clone() : written.toByteArray();
    }

    private DataInputStream reader() throws MessageNotReadableException {
        if (in == null) {
            throw new MessageNotReadableException("the message is in write mode; call reset() to read it");
        }
        return in;
    }

    private DataOutputStream writer() throws JMSException {
        checkWritable();
        if (out == null) {
            // a body made from bytes and not read-only (clearBody was not called): keep what is there
            written = new ByteArrayOutputStream();
            written.writeBytes(data);
            out = new DataOutputStream(written);
            data = null;
            in = null;
        }
        return out;
    }

    private static JMSException failed(IOException e) {
        if (e instanceof EOFException) {
            MessageEOFException eof = new MessageEOFException("the end of the message body was reached");
            eof.setLinkedException(e);
            return eof;
        }
        JMSException j = new MessageFormatException(e.toString());
        j.setLinkedException(e);
        return j;
    }

    @Override
    public long getBodyLength() throws JMSException {
        reader();
        return data.length;
    }

    @Override
    public boolean readBoolean() throws JMSException {
        try {
            return reader().readBoolean();
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public byte readByte() throws JMSException {
        try {
            return reader().readByte();
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public int readUnsignedByte() throws JMSException {
        try {
            return reader().readUnsignedByte();
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public short readShort() throws JMSException {
        try {
            return reader().readShort();
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public int readUnsignedShort() throws JMSException {
        try {
            return reader().readUnsignedShort();
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public char readChar() throws JMSException {
        try {
            return reader().readChar();
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public int readInt() throws JMSException {
        try {
            return reader().readInt();
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public long readLong() throws JMSException {
        try {
            return reader().readLong();
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public float readFloat() throws JMSException {
        try {
            return reader().readFloat();
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public double readDouble() throws JMSException {
        try {
            return reader().readDouble();
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public String readUTF() throws JMSException {
        try {
            return reader().readUTF();
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public int readBytes(byte[] value) throws JMSException {
        return readBytes(value, value.length);
    }

    @Override
    public int readBytes(byte[] value, int length) throws JMSException {
        if (length < 0 || length > value.length) {
            throw new IndexOutOfBoundsException("length " + length + " is outside 0.." + value.length);
        }
        try {
            DataInputStream r = reader();
            if (length > 0 && r.available() == 0) {
                return -1;
            }
            int n = r.read(value, 0, length);
            return n < 0 ? -1 : n;
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public void writeBoolean(boolean value) throws JMSException {
        try {
            writer().writeBoolean(value);
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public void writeByte(byte value) throws JMSException {
        try {
            writer().writeByte(value);
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public void writeShort(short value) throws JMSException {
        try {
            writer().writeShort(value);
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public void writeChar(char value) throws JMSException {
        try {
            writer().writeChar(value);
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public void writeInt(int value) throws JMSException {
        try {
            writer().writeInt(value);
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public void writeLong(long value) throws JMSException {
        try {
            writer().writeLong(value);
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public void writeFloat(float value) throws JMSException {
        try {
            writer().writeFloat(value);
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public void writeDouble(double value) throws JMSException {
        try {
            writer().writeDouble(value);
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public void writeUTF(String value) throws JMSException {
        try {
            writer().writeUTF(value);
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public void writeBytes(byte[] value) throws JMSException {
        writeBytes(value, 0, value.length);
    }

    @Override
    public void writeBytes(byte[] value, int offset, int length) throws JMSException {
        try {
            writer().write(value, offset, length);
        } catch (IOException e) {
            throw failed(e);
        }
    }

    @Override
    public void writeObject(Object value) throws JMSException {
        if (value == null) {
            throw new NullPointerException("writeObject(null)");
        }
        if (value instanceof Boolean v) {
            writeBoolean(v);
        } else if (value instanceof Byte v) {
            writeByte(v);
        } else if (value instanceof Short v) {
            writeShort(v);
        } else if (value instanceof Character v) {
            writeChar(v);
        } else if (value instanceof Integer v) {
            writeInt(v);
        } else if (value instanceof Long v) {
            writeLong(v);
        } else if (value instanceof Float v) {
            writeFloat(v);
        } else if (value instanceof Double v) {
            writeDouble(v);
        } else if (value instanceof String v) {
            writeUTF(v);
        } else if (value instanceof byte[] v) {
            writeBytes(v);
        } else {
            throw new MessageFormatException("writeObject cannot write a " + value.getClass().getName());
        }
    }

    /** Ends writing (the body becomes read-only) and rewinds to the first byte. */
    @Override
    public void reset() throws JMSException {
        if (out != null) {
            try {
                out.flush();
            } catch (IOException e) {
                throw failed(e);
            }
            data = written.toByteArray();
            written = null;
            out = null;
        }
        in = new DataInputStream(new ByteArrayInputStream(data));
        readOnlyBody = true;
    }

    @Override
    public void clearBody() throws JMSException {
        super.clearBody();
        written = new ByteArrayOutputStream();
        out = new DataOutputStream(written);
        data = null;
        in = null;
    }

    @Override
    public <T> T getBody(Class<T> c) throws JMSException {
        byte[] body = bodyBytes();
        if (body.length == 0) {
            return null;
        }
        if (!c.isAssignableFrom(byte[].class)) {
            throw new MessageFormatException("a BytesMessage body is a byte[], not a " + c.getName());
        }
        return c.cast(Arrays.copyOf(body, body.length));
    }

    @Override
    @SuppressWarnings("rawtypes")
    public boolean isBodyAssignableTo(Class c) {
        return bodyBytes().length == 0 || c.isAssignableFrom(byte[].class);
    }
}
