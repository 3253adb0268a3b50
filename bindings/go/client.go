// Package pymq is a thin Go client for the pymq broker: connect, send with the JMS headers of
// spec/stomp.md §4 and typed properties, subscribe with ack modes and prefetch, ack/nack, receipts and
// transactions.  Subpackages: stomp (the frame codec) and routing (group hash and routing).
//
// One Conn is one STOMP connection.  A reader goroutine owns the socket's input: it completes receipts
// and hands MESSAGE frames to their Subscription.  Every subscription uses broker credit (prefetch-count)
// and a buffer of exactly that size, so the broker never sends more than the buffer holds and a slow
// reader never stalls the connection's receipts: AckAuto is JMS AUTO_ACKNOWLEDGE, a client-individual
// subscription acknowledged as Receive returns each message (as the Python SDK does), not STOMP's
// ack:auto, which has no credit.  An ERROR frame ends the connection (the broker closes it): every
// waiting call and every later one returns that *ServerError.  Every blocking call has a deadline
// (Options.Timeout or the context).  Heart-beats are not negotiated (0,0).
package pymq

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/pymq/pymq-go/stomp"
)

// ErrClosed is returned by operations on a connection closed by Close.
var ErrClosed = errors.New("pymq: connection closed")

// ServerError is an ERROR frame from the broker (spec/stomp.md §6).
type ServerError struct {
	Code    string            // pymq-code, e.g. "invalid-destination"
	Message string            // the message header: a human sentence
	Fields  map[string]string // pymq-field-* headers without the prefix
	Body    string
}

func (e *ServerError) Error() string {
	if e.Code == "" {
		return "pymq: broker error: " + e.Message
	}
	return "pymq: " + e.Code + ": " + e.Message
}

func serverError(f *stomp.Frame) *ServerError {
	e := &ServerError{Code: f.Value("pymq-code"), Message: f.Value("message"), Fields: map[string]string{},
		Body: string(f.Body)}
	for _, h := range f.Headers {
		if strings.HasPrefix(h.Name, "pymq-field-") {
			e.Fields[strings.TrimPrefix(h.Name, "pymq-field-")] = h.Value
		}
	}
	return e
}

// Options configure Dial.  The zero value connects as guest (accepted from loopback only).
type Options struct {
	Login, Passcode string
	ClientID        string        // JMS client id: scopes durable subscriptions
	Version         string        // the one STOMP version to accept; "" accepts 1.1 and 1.2
	Timeout         time.Duration // connect and receipt waits; default 10 s
	// AsyncSend makes Send return without waiting for the broker's receipt on persistent messages
	// (the default waits, so a returned Send means the message is durable and Message.ID is set).
	AsyncSend bool
}

// Conn is a connection to a pymq broker.  It is safe for concurrent use.
type Conn struct {
	opts    Options
	netConn net.Conn
	version string
	session string

	writeMu sync.Mutex

	mu        sync.Mutex
	receipts  map[string]chan *stomp.Frame
	subs      map[string]*Subscription
	nextID    int
	err       error
	closed    chan struct{}
	closeOnce sync.Once
}

// Dial connects to addr ("host:port" or "stomp://host:port") and completes the STOMP handshake.
func Dial(addr string, opts Options) (*Conn, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = 10 * time.Second
	}
	if opts.Login == "" {
		opts.Login, opts.Passcode = "guest", "guest"
	}
	addr = strings.TrimPrefix(addr, "stomp://")
	nc, err := net.DialTimeout("tcp", addr, opts.Timeout)
	if err != nil {
		return nil, fmt.Errorf("pymq: cannot connect to %s: %w", addr, err)
	}
	accept := opts.Version
	if accept == "" {
		accept = "1.1,1.2"
	}
	headers := []stomp.Header{{Name: "accept-version", Value: accept}, {Name: "host", Value: "/"},
		{Name: "login", Value: opts.Login}, {Name: "passcode", Value: opts.Passcode},
		{Name: "heart-beat", Value: "0,0"}}
	if opts.ClientID != "" {
		headers = append(headers, stomp.Header{Name: "client-id", Value: opts.ClientID})
	}
	c := &Conn{opts: opts, netConn: nc, receipts: map[string]chan *stomp.Frame{},
		subs: map[string]*Subscription{}, closed: make(chan struct{})}
	data, err := stomp.Encode("CONNECT", headers, nil, stomp.V12)
	if err != nil {
		nc.Close()
		return nil, err
	}
	_ = nc.SetDeadline(time.Now().Add(opts.Timeout))
	if _, err := nc.Write(data); err != nil {
		nc.Close()
		return nil, fmt.Errorf("pymq: CONNECT: %w", err)
	}
	scanner := stomp.NewScanner(stomp.V10)
	scanner.MaxFrameSize = 64 << 20
	var first *stomp.Frame
	buf := make([]byte, 64<<10)
	for first == nil {
		n, err := nc.Read(buf)
		if n > 0 {
			frames, ferr := scanner.Feed(buf[:n])
			if ferr != nil {
				nc.Close()
				return nil, fmt.Errorf("pymq: CONNECT: %w", ferr)
			}
			if len(frames) > 0 {
				first = &frames[0]
			}
		}
		if err != nil && first == nil {
			nc.Close()
			return nil, fmt.Errorf("pymq: CONNECT: no answer from the broker: %w", err)
		}
	}
	if first.Command == "ERROR" {
		nc.Close()
		return nil, serverError(first)
	}
	if first.Command != "CONNECTED" {
		nc.Close()
		return nil, fmt.Errorf("pymq: expected CONNECTED, got %s", first.Command)
	}
	c.version = first.Value("version")
	if c.version == "" {
		c.version = stomp.V10
	}
	c.session = first.Value("session")
	scanner.Version = c.version
	_ = nc.SetDeadline(time.Time{})
	go c.readLoop(scanner)
	return c, nil
}

// Version is the negotiated STOMP version.
func (c *Conn) Version() string { return c.version }

// Session is the broker's id for this connection.
func (c *Conn) Session() string { return c.session }

// Err is why the connection ended (nil while it is open).
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

func (c *Conn) id(prefix string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID++
	return prefix + strconv.Itoa(c.nextID)
}

func (c *Conn) fail(err error) {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.err = err
		c.mu.Unlock()
		close(c.closed)
		c.netConn.Close()
	})
}

func (c *Conn) readLoop(scanner *stomp.Scanner) {
	buf := make([]byte, 64<<10)
	for {
		n, err := c.netConn.Read(buf)
		if n > 0 {
			frames, ferr := scanner.Feed(buf[:n])
			for i := range frames {
				c.dispatch(&frames[i])
			}
			if ferr != nil {
				c.fail(fmt.Errorf("pymq: broker sent a malformed frame: %w", ferr))
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				c.fail(fmt.Errorf("pymq: the broker closed the connection: %w", ErrClosed))
			} else {
				c.fail(fmt.Errorf("pymq: connection lost: %w", err))
			}
			return
		}
	}
}

func (c *Conn) dispatch(f *stomp.Frame) {
	switch f.Command {
	case "RECEIPT":
		id := f.Value("receipt-id")
		c.mu.Lock()
		ch := c.receipts[id]
		delete(c.receipts, id)
		c.mu.Unlock()
		if ch != nil {
			ch <- f
		}
	case "MESSAGE":
		c.mu.Lock()
		sub := c.subs[f.Value("subscription")]
		c.mu.Unlock()
		if sub != nil {
			sub.deliver(f)
		}
	case "ERROR":
		err := serverError(f)
		c.fail(err)
	}
}

func (c *Conn) write(command string, headers []stomp.Header, body []byte) error {
	data, err := stomp.Encode(command, headers, body, c.version)
	if err != nil {
		return err
	}
	select {
	case <-c.closed:
		return c.Err()
	default:
	}
	c.writeMu.Lock()
	defer c.writeMu.Unlock()
	_ = c.netConn.SetWriteDeadline(time.Now().Add(c.opts.Timeout))
	if _, err := c.netConn.Write(data); err != nil {
		c.fail(fmt.Errorf("pymq: write failed: %w", err))
		return c.Err()
	}
	return nil
}

// request sends a frame with a receipt header and waits for the RECEIPT (or the ERROR that ends the
// connection).  A RECEIPT confirms every earlier frame of the connection.
func (c *Conn) request(ctx context.Context, command string, headers []stomp.Header, body []byte) (*stomp.Frame, error) {
	id := c.id("r-")
	ch := make(chan *stomp.Frame, 1)
	c.mu.Lock()
	c.receipts[id] = ch
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.receipts, id)
		c.mu.Unlock()
	}()
	if err := c.write(command, append(headers, stomp.Header{Name: "receipt", Value: id}), body); err != nil {
		return nil, err
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.Timeout)
		defer cancel()
	}
	select {
	case f := <-ch:
		return f, nil
	case <-c.closed:
		select { // the RECEIPT may have come just before the broker closed the connection
		case f := <-ch:
			return f, nil
		default:
		}
		return nil, c.Err()
	case <-ctx.Done():
		return nil, fmt.Errorf("pymq: no RECEIPT for %s: %w", command, ctx.Err())
	}
}

// Send sends m to destination ("/queue/x", "/topic/x", "/temp-queue/x").  A persistent message waits
// for the broker's receipt (it is then durable) and gets its ID, unless Options.AsyncSend is set.
func (c *Conn) Send(destination string, m *Message) error {
	return c.send(context.Background(), destination, m, "")
}

func (c *Conn) send(ctx context.Context, destination string, m *Message, tx string) error {
	if m.Priority < 0 || m.Priority > 9 {
		return fmt.Errorf("pymq: priority must be between 0 and 9, got %d", m.Priority)
	}
	if m.Timestamp == 0 {
		m.Timestamp = nowMillis()
	}
	m.Destination = destination
	headers := append([]stomp.Header{{Name: "destination", Value: destination}}, m.sendHeaders()...)
	if tx != "" {
		return c.write("SEND", append(headers, stomp.Header{Name: "transaction", Value: tx}), m.Body)
	}
	if m.NonPersistent || c.opts.AsyncSend {
		return c.write("SEND", headers, m.Body)
	}
	receipt, err := c.request(ctx, "SEND", headers, m.Body)
	if err != nil {
		return err
	}
	m.ID = receipt.Value("message-id")
	return nil
}

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

// Subscription receives the messages of one SUBSCRIBE.
type Subscription struct {
	ID          string
	Destination string
	Ack         AckMode
	conn        *Conn
	inbox       chan *Message
	done        chan struct{}
	doneOnce    sync.Once
}

type delivery struct {
	sub   *Subscription
	ackID string // the 1.2 ack header
	msgID string
}

// Subscribe subscribes to destination and waits for the broker to confirm it (a bad selector or
// destination is returned here as a *ServerError).
func (c *Conn) Subscribe(destination string, opts SubscribeOptions) (*Subscription, error) {
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
	headers = append(headers, opts.Headers...)
	c.mu.Lock()
	c.subs[sub.ID] = sub
	c.mu.Unlock()
	if _, err := c.request(context.Background(), "SUBSCRIBE", headers, nil); err != nil {
		c.mu.Lock()
		delete(c.subs, sub.ID)
		c.mu.Unlock()
		return nil, err
	}
	return sub, nil
}

func (s *Subscription) deliver(f *stomp.Frame) {
	m := MessageFromFrame(f)
	m.delivery = &delivery{sub: s, ackID: f.Value("ack"), msgID: f.Value("message-id")}
	select {
	case s.inbox <- m: // the broker's credit keeps this from filling; if it ever did, TCP pushes back
	case <-s.done: // unsubscribed locally: drop
	case <-s.conn.closed:
	}
}

// Receive returns the next message, or the context's error when it ends first, or the connection's
// error once it has ended and every message that had arrived was received.  On an AckAuto
// subscription it acknowledges the message as it returns it.
func (s *Subscription) Receive(ctx context.Context) (*Message, error) {
	select {
	case m := <-s.inbox:
		return s.received(m)
	default:
	}
	select {
	case m := <-s.inbox:
		return s.received(m)
	case <-s.done:
		return nil, fmt.Errorf("pymq: subscription %s was unsubscribed", s.ID)
	case <-s.conn.closed:
		return nil, s.conn.Err()
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (s *Subscription) received(m *Message) (*Message, error) {
	if s.Ack == AckAuto {
		if err := s.conn.write("ACK", s.conn.wireAckHeaders(m.delivery), nil); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// Unsubscribe ends the subscription; messages not yet received are dropped (unacknowledged ones return
// to their queue on the broker).
func (s *Subscription) Unsubscribe() error {
	s.doneOnce.Do(func() { close(s.done) })
	_, err := s.conn.request(context.Background(), "UNSUBSCRIBE", []stomp.Header{{Name: "id", Value: s.ID}}, nil)
	s.conn.mu.Lock()
	delete(s.conn.subs, s.ID)
	s.conn.mu.Unlock()
	return err
}

func (c *Conn) ackHeaders(m *Message) ([]stomp.Header, error) {
	d := m.delivery
	if d == nil || d.sub.conn != c {
		return nil, errors.New("pymq: only a message received on this connection can be acknowledged")
	}
	if d.sub.Ack == AckAuto {
		return nil, errors.New("pymq: messages of an auto-ack subscription are acknowledged by Receive")
	}
	return c.wireAckHeaders(d), nil
}

func (c *Conn) wireAckHeaders(d *delivery) []stomp.Header {
	if c.version == stomp.V12 {
		return []stomp.Header{{Name: "id", Value: d.ackID}}
	}
	return []stomp.Header{{Name: "message-id", Value: d.msgID}, {Name: "subscription", Value: d.sub.ID}}
}

func (c *Conn) acknowledge(m *Message, command, tx string) error {
	if command == "NACK" && c.version == stomp.V10 {
		return errors.New("pymq: STOMP 1.0 has no NACK")
	}
	headers, err := c.ackHeaders(m)
	if err != nil {
		return err
	}
	if tx != "" {
		headers = append(headers, stomp.Header{Name: "transaction", Value: tx})
	}
	return c.write(command, headers, nil)
}

// Ack acknowledges m (and, on a client-mode subscription, every earlier message of it).
func (m *Message) Ack() error {
	if m.delivery == nil {
		return errors.New("pymq: the message was not received from a subscription")
	}
	return m.delivery.sub.conn.acknowledge(m, "ACK", "")
}

// Nack gives m back for redelivery (after max_deliveries it goes to the dead-letter queue).
func (m *Message) Nack() error {
	if m.delivery == nil {
		return errors.New("pymq: the message was not received from a subscription")
	}
	return m.delivery.sub.conn.acknowledge(m, "NACK", "")
}

// Tx is a STOMP transaction: its sends, acks and nacks take effect together at Commit, or not at all.
type Tx struct {
	ID   string
	conn *Conn
}

// Begin starts a transaction.
func (c *Conn) Begin() (*Tx, error) {
	tx := &Tx{ID: c.id("tx-"), conn: c}
	if err := c.write("BEGIN", []stomp.Header{{Name: "transaction", Value: tx.ID}}, nil); err != nil {
		return nil, err
	}
	return tx, nil
}

// Send sends m inside the transaction.
func (t *Tx) Send(destination string, m *Message) error {
	return t.conn.send(context.Background(), destination, m, t.ID)
}

// Ack acknowledges m inside the transaction.
func (t *Tx) Ack(m *Message) error { return t.conn.acknowledge(m, "ACK", t.ID) }

// Nack returns m for redelivery inside the transaction.
func (t *Tx) Nack(m *Message) error { return t.conn.acknowledge(m, "NACK", t.ID) }

// Commit applies the transaction and waits for the broker to confirm it.
func (t *Tx) Commit() error {
	_, err := t.conn.request(context.Background(), "COMMIT", []stomp.Header{{Name: "transaction", Value: t.ID}}, nil)
	return err
}

// Abort discards the transaction's sends; messages acked in it stay unacknowledged.
func (t *Tx) Abort() error {
	_, err := t.conn.request(context.Background(), "ABORT", []stomp.Header{{Name: "transaction", Value: t.ID}}, nil)
	return err
}

// Close disconnects gracefully: DISCONNECT, wait for its receipt (every earlier frame is then
// processed), close the socket.  The broker returns unacknowledged messages to their queues.
func (c *Conn) Close() error {
	select {
	case <-c.closed:
		return nil
	default:
	}
	// a subscription nobody reads may have stopped the reader: release them all so the RECEIPT gets
	// through (unacknowledged messages go back to their queues on the broker anyway)
	c.mu.Lock()
	for _, sub := range c.subs {
		sub.doneOnce.Do(func() { close(sub.done) })
	}
	c.mu.Unlock()
	_, err := c.request(context.Background(), "DISCONNECT", nil, nil)
	c.fail(ErrClosed)
	if err != nil && !errors.Is(err, ErrClosed) {
		return err
	}
	return nil
}
