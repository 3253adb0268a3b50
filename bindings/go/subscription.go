package pymq

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/pymq/pymq/bindings/go/stomp"
)

// AckMode is a subscription's acknowledgement mode.
type AckMode string

// Ack modes: auto (Receive acknowledges each message as it returns it: JMS AUTO_ACKNOWLEDGE), client
// (Message.Ack acknowledges it and every earlier one of the subscription), and client-individual (one
// message at a time).
const (
	AckAuto             AckMode = "auto"
	AckClient           AckMode = "client"
	AckClientIndividual AckMode = "client-individual"
)

// DefaultPrefetch is the credit of a subscription that does not set one (the broker's default too).
const DefaultPrefetch = 1000

// SubscribeOptions configure Subscribe.
type SubscribeOptions struct {
	Ack         AckMode // "" is auto
	Prefetch    int     // most unacknowledged messages outstanding (prefetch-count); 0 = DefaultPrefetch
	Selector    string  // JMS message selector
	DurableName string  // durable topic subscription name
	NoLocal     bool    // skip messages this connection published
	Headers     []stomp.Header
}

// Subscription receives the messages of one SUBSCRIBE.  After a reconnect it is subscribed again with
// the same id and headers.
type Subscription struct {
	ID          string
	Destination string
	Ack         AckMode
	conn        *Conn
	headers     []stomp.Header // the SUBSCRIBE headers, for subscribing again after a reconnect
	inbox       chan *Message
	done        chan struct{}
	doneOnce    sync.Once
	pumpOnce    sync.Once
	out         chan *Message
	handing     sync.WaitGroup // a message being handed over by C's goroutine, and its ACK
}

type delivery struct {
	sub   *Subscription
	ackID string // the 1.2 ack header
	msgID string
	gen   uint64 // the link it came on
}

// Subscribe subscribes to destination and waits for the broker to confirm it (a bad selector or
// destination is returned here as a *ServerError).
func (c *Conn) Subscribe(ctx context.Context, destination string, opts SubscribeOptions) (*Subscription, error) {
	if opts.Ack == "" {
		opts.Ack = AckAuto
	}
	prefetch := opts.Prefetch
	if prefetch <= 0 {
		prefetch = DefaultPrefetch
	}
	wireAck := opts.Ack
	if wireAck == AckAuto {
		wireAck = AckClientIndividual // credit needs acks: Receive sends them
	}
	sub := &Subscription{ID: c.id("sub-"), Destination: destination, Ack: opts.Ack, conn: c,
		inbox: make(chan *Message, prefetch), done: make(chan struct{})}
	headers := []stomp.Header{{Name: "destination", Value: destination}, {Name: "id", Value: sub.ID},
		{Name: "ack", Value: string(wireAck)}, {Name: "prefetch-count", Value: strconv.Itoa(prefetch)}}
	if opts.Selector != "" {
		headers = append(headers, stomp.Header{Name: "selector", Value: opts.Selector})
	}
	if opts.DurableName != "" {
		headers = append(headers, stomp.Header{Name: "durable-subscription-name", Value: opts.DurableName})
	}
	if opts.NoLocal {
		headers = append(headers, stomp.Header{Name: "no-local", Value: "true"})
	}
	sub.headers = append(headers, opts.Headers...)
	c.mu.Lock()
	c.subs[sub.ID] = sub
	c.mu.Unlock()
	if _, err := c.request(ctx, "SUBSCRIBE", sub.headers, nil); err != nil {
		c.mu.Lock()
		delete(c.subs, sub.ID)
		c.mu.Unlock()
		sub.end()
		return nil, err
	}
	return sub, nil
}

func (s *Subscription) deliver(l *link, f *stomp.Frame) {
	m := MessageFromFrame(f)
	m.delivery = &delivery{sub: s, ackID: f.Value("ack"), msgID: f.Value("message-id"), gen: l.gen}
	select {
	case s.inbox <- m: // the broker's credit keeps this from filling; if it ever did, TCP pushes back
	case <-s.done: // unsubscribed locally: drop
	case <-l.done: // the link died: the broker takes the message back
	}
}

func (s *Subscription) end() {
	s.doneOnce.Do(func() { close(s.done) })
}

// stale: the message came on a link that is no longer the one in use (the broker redelivers it).
func (c *Conn) stale(m *Message) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return m.delivery.gen < c.gen
}

// Receive returns the next message, or the context's error when it ends first, or the connection's
// error once it has ended.  On an AckAuto subscription it acknowledges the message as it returns it.
// While the connection is reconnecting it waits.  It never returns a message of a link that has since
// been replaced: the broker redelivers those.
func (s *Subscription) Receive(ctx context.Context) (*Message, error) {
	for {
		var m *Message
		select {
		case m = <-s.inbox:
		default:
			select {
			case m = <-s.inbox:
			case <-s.done:
				if err := s.conn.Err(); err != nil {
					return nil, err
				}
				return nil, fmt.Errorf("pymq: subscription %s was unsubscribed", s.ID)
			case <-s.conn.closed:
				return nil, s.conn.Err()
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		if s.conn.stale(m) {
			continue
		}
		if s.Ack == AckAuto {
			if err := s.conn.acknowledge(ctx, m, "ACK", nil, true); err != nil {
				if errors.Is(err, ErrStaleMessage) {
					continue
				}
				return nil, err
			}
		}
		return m, nil
	}
}

// C returns a channel of the subscription's messages, for use in a select.  A goroutine receives them
// (acknowledging each as it hands it over on an AckAuto subscription); the channel is closed when the
// subscription or the connection ends (Conn.Err says why).  Use either C or Receive on a subscription.
func (s *Subscription) C() <-chan *Message {
	s.pumpOnce.Do(func() {
		s.out = make(chan *Message)
		go func() {
			defer close(s.out)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			go func() {
				select {
				case <-s.done:
				case <-s.conn.closed:
				}
				cancel()
			}()
			for {
				m, err := s.nextForChannel(ctx)
				if err != nil {
					return
				}
				s.handing.Add(1)
				select {
				case s.out <- m:
					if s.Ack == AckAuto { // handed over: that is what auto acknowledges
						_ = s.conn.acknowledge(context.Background(), m, "ACK", nil, true)
					}
					s.handing.Done()
				case <-ctx.Done():
					s.handing.Done()
					return
				}
			}
		}()
	})
	return s.out
}

// nextForChannel takes the next fresh message; an auto message is acknowledged by the pump once the
// channel's reader took it (see C), not here.
func (s *Subscription) nextForChannel(ctx context.Context) (*Message, error) {
	if s.Ack != AckAuto {
		return s.Receive(ctx)
	}
	for {
		select {
		case m := <-s.inbox:
			if s.conn.stale(m) {
				continue
			}
			return m, nil
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// Unsubscribe ends the subscription; messages not yet received are dropped (unacknowledged ones return
// to their queue on the broker).
func (s *Subscription) Unsubscribe(ctx context.Context) error {
	s.end()
	s.handing.Wait() // a message C handed over is acknowledged before the subscription ends
	c := s.conn
	c.mu.Lock()
	delete(c.subs, s.ID)
	up := c.link != nil
	c.mu.Unlock()
	if !up {
		return nil // reconnecting: it will not be subscribed again
	}
	_, err := c.request(ctx, "UNSUBSCRIBE", []stomp.Header{{Name: "id", Value: s.ID}}, nil)
	return err
}

func wireAckHeaders(version string, d *delivery) []stomp.Header {
	if version == stomp.V12 {
		return []stomp.Header{{Name: "id", Value: d.ackID}}
	}
	return []stomp.Header{{Name: "message-id", Value: d.msgID}, {Name: "subscription", Value: d.sub.ID}}
}

// acknowledge sends ACK or NACK for m on the link it came on, or ErrStaleMessage when that link is gone.
func (c *Conn) acknowledge(ctx context.Context, m *Message, command string, tx *Tx, auto bool) error {
	d := m.delivery
	if d == nil || d.sub.conn != c {
		return errors.New("pymq: only a message received on this connection can be acknowledged")
	}
	if !auto && d.sub.Ack == AckAuto {
		return errors.New("pymq: messages of an auto-ack subscription are acknowledged by Receive")
	}
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	var l *link
	var err error
	if tx != nil {
		var done func()
		l, done, err = tx.link(ctx)
		if err != nil {
			return err
		}
		defer done()
	} else if l, err = c.current(ctx); err != nil {
		return err
	}
	if l.gen != d.gen {
		return ErrStaleMessage
	}
	if command == "NACK" && l.version == stomp.V10 {
		return errors.New("pymq: STOMP 1.0 has no NACK")
	}
	headers := wireAckHeaders(l.version, d)
	if tx != nil {
		headers = append(headers, stomp.Header{Name: "transaction", Value: tx.ID})
		tx.did()
	}
	return l.write(ctx, command, headers, nil)
}

// Ack acknowledges m (and, on a client-mode subscription, every earlier message of it).
func (m *Message) Ack(ctx context.Context) error {
	if m.delivery == nil {
		return errors.New("pymq: the message was not received from a subscription")
	}
	return m.delivery.sub.conn.acknowledge(ctx, m, "ACK", nil, false)
}

// Nack gives m back for redelivery (after max_deliveries it goes to the dead-letter queue).
func (m *Message) Nack(ctx context.Context) error {
	if m.delivery == nil {
		return errors.New("pymq: the message was not received from a subscription")
	}
	return m.delivery.sub.conn.acknowledge(ctx, m, "NACK", nil, false)
}
