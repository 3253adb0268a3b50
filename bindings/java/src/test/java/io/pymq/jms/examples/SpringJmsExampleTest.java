package io.pymq.jms.examples;

import io.pymq.jms.PymqConnectionFactory;
import io.pymq.testing.Broker;
import jakarta.jms.ConnectionFactory;
import jakarta.jms.JMSException;
import jakarta.jms.Message;
import jakarta.jms.TextMessage;
import org.junit.jupiter.api.Test;
import org.springframework.context.annotation.AnnotationConfigApplicationContext;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.jms.annotation.EnableJms;
import org.springframework.jms.annotation.JmsListener;
import org.springframework.jms.config.DefaultJmsListenerContainerFactory;
import org.springframework.jms.connection.CachingConnectionFactory;
import org.springframework.jms.core.JmsTemplate;
import org.springframework.jms.listener.DefaultMessageListenerContainer;
import org.springframework.messaging.handler.annotation.Header;
import org.springframework.messaging.handler.annotation.SendTo;

import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CopyOnWriteArrayList;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

/**
 * The most common way Java applications use JMS, with pymq swapped in: Spring JMS's {@link JmsTemplate} and
 * message listener containers ({@code @JmsListener} on a {@link DefaultJmsListenerContainerFactory}, and a
 * {@link DefaultMessageListenerContainer} wired by hand).  The application code names only Spring and
 * {@code jakarta.jms}; {@link PymqConnectionFactory} is the one pymq class, in the configuration.
 */
public class SpringJmsExampleTest {
    public static final String RUN = UUID.randomUUID().toString().substring(0, 8);
    public static final String ORDERS = "spring-orders-" + RUN;
    public static final String CONFIRMATIONS = "spring-confirmations-" + RUN;

    @Configuration
    @EnableJms
    static class App {
        @Bean
        ConnectionFactory connectionFactory() {
            // the only pymq line of the application
            return new CachingConnectionFactory(new PymqConnectionFactory(Broker.url()));
        }

        @Bean
        JmsTemplate jmsTemplate(ConnectionFactory cf) {
            JmsTemplate t = new JmsTemplate(cf);
            t.setReceiveTimeout(10_000);
            return t;
        }

        @Bean
        DefaultJmsListenerContainerFactory jmsListenerContainerFactory(ConnectionFactory cf) {
            DefaultJmsListenerContainerFactory f = new DefaultJmsListenerContainerFactory();
            f.setConnectionFactory(cf);
            f.setSessionTransacted(true);      // a listener that throws rolls back: the message comes again
            f.setReceiveTimeout(500L);
            return f;
        }

        @Bean
        OrderDesk orderDesk() {
            return new OrderDesk();
        }
    }

    /** Application code: confirms orders; the first delivery of a "flaky" order fails. */
    static class OrderDesk {
        final AtomicInteger flakyAttempts = new AtomicInteger();

        @JmsListener(destination = "#{T(io.pymq.jms.examples.SpringJmsExampleTest).ORDERS}")
        @SendTo("#{T(io.pymq.jms.examples.SpringJmsExampleTest).CONFIRMATIONS}")
        String onOrder(String order, @Header("qty") long qty, @Header(name = "JMSXDeliveryCount") int attempt) {
            if (order.startsWith("flaky") && flakyAttempts.incrementAndGet() == 1) {
                throw new IllegalStateException("the first attempt fails on purpose");
            }
            return "confirmed " + order + " x" + qty + " (attempt " + attempt + ")";
        }
    }

    @Test
    void jmsTemplateAndAnnotatedListenersThroughPymq() {
        try (AnnotationConfigApplicationContext ctx = new AnnotationConfigApplicationContext(App.class)) {
            JmsTemplate jms = ctx.getBean(JmsTemplate.class);
            jms.convertAndSend(ORDERS, "order-1", m -> {
                m.setLongProperty("qty", 3);
                return m;
            });
            jms.convertAndSend(ORDERS, "flaky-2", m -> {
                m.setLongProperty("qty", 1);
                return m;
            });
            assertEquals("confirmed order-1 x3 (attempt 1)", jms.receiveAndConvert(CONFIRMATIONS));
            assertEquals("confirmed flaky-2 x1 (attempt 2)", jms.receiveAndConvert(CONFIRMATIONS),
                    "the transacted container rolled back and the broker redelivered");
            // a Map travels as a MapMessage (spec/stomp.md §7) through Spring's SimpleMessageConverter
            jms.convertAndSend("spring-maps-" + RUN, Map.of("sku", "A-1", "qty", 2L));
            assertEquals(Map.of("sku", "A-1", "qty", 2L), jms.receiveAndConvert("spring-maps-" + RUN));
        }
    }

    @Test
    void defaultMessageListenerContainerOnATopicAndRequestReply() throws Exception {
        ConnectionFactory cf = new CachingConnectionFactory(new PymqConnectionFactory(Broker.url()));
        String topic = "spring-prices-" + RUN;
        List<String> seen = new CopyOnWriteArrayList<>();
        CountDownLatch three = new CountDownLatch(3);
        DefaultMessageListenerContainer container = new DefaultMessageListenerContainer();
        container.setConnectionFactory(cf);
        container.setDestinationName(topic);
        container.setPubSubDomain(true);
        container.setReceiveTimeout(500);
        container.setMessageListener((jakarta.jms.MessageListener) m -> {
            try {
                seen.add(((TextMessage) m).getText());
            } catch (JMSException e) {
                throw new RuntimeException(e);
            }
            three.countDown();
        });
        container.afterPropertiesSet();
        container.start();
        try {
            JmsTemplate publisher = new JmsTemplate(cf);
            publisher.setPubSubDomain(true);
            for (int i = 0; i < 200 && !container.isRegisteredWithDestination(); i++) {
                Thread.sleep(50);        // a topic delivers only to subscribers that exist when it is sent
            }
            assertTrue(container.isRegisteredWithDestination(), "the container subscribed");
            for (String p : List.of("p1", "p2", "p3")) {
                publisher.convertAndSend(topic, p);
            }
            assertTrue(three.await(10, TimeUnit.SECONDS), seen.toString());
            assertEquals(List.of("p1", "p2", "p3"), seen);
        } finally {
            container.stop();
            container.shutdown();
        }
        // request/reply: JmsTemplate.sendAndReceive waits on a temporary queue for the answer
        String service = "spring-echo-" + RUN;
        DefaultMessageListenerContainer echo = new DefaultMessageListenerContainer();
        echo.setConnectionFactory(cf);
        echo.setDestinationName(service);
        echo.setReceiveTimeout(500);
        JmsTemplate replier = new JmsTemplate(cf);
        echo.setMessageListener((jakarta.jms.MessageListener) m -> replier.send(get(m), s -> {
            TextMessage r = s.createTextMessage("echo:" + ((TextMessage) m).getText());
            r.setJMSCorrelationID(m.getJMSMessageID());
            return r;
        }));
        echo.afterPropertiesSet();
        echo.start();
        try {
            JmsTemplate client = new JmsTemplate(cf);
            client.setReceiveTimeout(10_000);
            Message answer = client.sendAndReceive(service, s -> s.createTextMessage("hi"));
            assertEquals("echo:hi", ((TextMessage) answer).getText());
        } finally {
            echo.stop();
            echo.shutdown();
        }
    }

    private static jakarta.jms.Destination get(Message m) {
        try {
            return m.getJMSReplyTo();
        } catch (JMSException e) {
            throw new RuntimeException(e);
        }
    }
}
