package io.pymq.jms;

import io.pymq.stomp.Frame;
import io.pymq.stomp.Header;
import jakarta.jms.IllegalStateException;
import jakarta.jms.JMSException;
import jakarta.jms.Message;
import jakarta.jms.Queue;
import jakarta.jms.QueueBrowser;

import java.util.ArrayDeque;
import java.util.ArrayList;
import java.util.Enumeration;
import java.util.List;
import java.util.NoSuchElementException;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;

/**
 * A QueueBrowser: reads a queue's waiting messages without removing them, through range browses
 * (spec/stomp.md §9: SUBSCRIBE with {@code browser:true}, {@code pymq-from-seq} and
 * {@code pymq-max-messages}), one page of {@value #PAGE} messages at a time as the enumeration advances,
 * so browsing a deep queue holds one page in memory.  Messages come in the queue's sequence (enqueue)
 * order; each enumeration is a fresh look, so messages consumed meanwhile are not shown and new ones may be.
 */
public class PymqQueueBrowser implements QueueBrowser {
    static final int PAGE = 500;

    private final PymqSession session;
    private final Queue queue;
    private final String selector;
    private volatile boolean closed;

    PymqQueueBrowser(PymqSession session, Queue queue, String selector) {
        this.session = session;
        this.queue = queue;
        this.selector = selector == null || selector.isBlank() ? null : selector;
    }

    @Override
    public Queue getQueue() throws JMSException {
        checkOpen();
        return queue;
    }

    @Override
    public String getMessageSelector() throws JMSException {
        checkOpen();
        return selector;
    }

    @Override
    public Enumeration<Message> getEnumeration() throws JMSException {
        checkOpen();
        Pages pages = new Pages();
        pages.fetch();     // the first page now, so errors surface here
        return pages;
    }

    @Override
    public void close() {
        closed = true;
    }

    private void checkOpen() throws JMSException {
        if (closed) {
            throw new IllegalStateException("the browser is closed");
        }
        session.checkOpen();
    }

    /** One page: the messages and where the next read continues. */
    private record Page(List<Message> messages, long nextSeq, long latest) {
    }

    private Page browse(long fromSeq) throws JMSException {
        PymqConnection connection = session.connection;
        String subId = connection.nextId("browse-");
        LinkedBlockingQueue<Frame> frames = new LinkedBlockingQueue<>();
        Frame wake = new Frame("WAKE", List.of());
        connection.register(subId, new PymqConnection.Subscriber() {
            @Override
            public void deliver(Frame frame, BrokerLink link) {
                frames.add(frame);
            }

            @Override
            public void wake() {
                frames.add(wake);
            }

            @Override
            public void linkLost() {
                frames.add(wake);      // the page went with the link: the browse fails, the connection goes on
            }
        });
        try {
            List<Header> h = new ArrayList<>();
            h.add(new Header("destination", ((PymqDestination) queue).stompName()));
            h.add(new Header("id", subId));
            h.add(new Header("ack", "auto"));
            h.add(new Header("browser", "true"));
            h.add(new Header("pymq-source", "queue"));
            h.add(new Header("pymq-from-seq", Long.toString(fromSeq)));
            h.add(new Header("pymq-max-messages", Integer.toString(PAGE)));
            if (selector != null) {
                h.add(new Header("selector", selector));
            }
            connection.link().call("SUBSCRIBE", h, null);
            List<Message> out = new ArrayList<>();
            long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(connection.factory().getTimeout());
            while (true) {
                long left = deadline - System.nanoTime();
                Frame f = left > 0 ? frames.poll(left, TimeUnit.NANOSECONDS) : null;
                if (f == null) {
                    throw new JMSException("the browse of " + queue + " did not finish in time", "timeout");
                }
                if (f == wake) {
                    connection.checkOpen();
                    throw new IllegalStateException("the connection closed during the browse");
                }
                if ("end".equals(f.get("browser"))) {
                    return new Page(out, Long.parseLong(f.get("pymq-next-seq", "0")),
                            Long.parseLong(f.get("pymq-latest-seq", "0")));
                }
                PymqMessage m = WireFormat.fromFrame(f);
                m.received();
                out.add(m);
            }
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            throw new JMSException("interrupted while browsing " + queue);
        } finally {
            connection.unregister(subId);
        }
    }

    /** The enumeration: fetches the next page when the current one is used up. */
    private final class Pages implements Enumeration<Message> {
        private final ArrayDeque<Message> buffered = new ArrayDeque<>();
        private long next;
        private boolean done;

        void fetch() throws JMSException {
            Page p = browse(next);
            buffered.addAll(p.messages());
            done = p.messages().size() < PAGE || p.nextSeq() > p.latest() || p.nextSeq() <= next;
            next = p.nextSeq();
        }

        @Override
        public boolean hasMoreElements() {
            while (buffered.isEmpty() && !done && !closed) {
                try {
                    fetch();
                } catch (JMSException e) {
                    done = true;
                    throw new BrowseFailedException(e);
                }
            }
            return !buffered.isEmpty();
        }

        @Override
        public Message nextElement() {
            if (!hasMoreElements()) {
                throw new NoSuchElementException("no more messages in " + queue);
            }
            return buffered.poll();
        }
    }

    /** Enumeration cannot throw checked exceptions: a failed page read surfaces as this. */
    static final class BrowseFailedException extends RuntimeException {
        BrowseFailedException(JMSException cause) {
            super("browsing failed: " + cause.getMessage(), cause);
        }
    }
}
