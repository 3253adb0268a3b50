// Package pymq is a Go client for the pymq broker: connect (TCP, TLS or a net.Conn of your own), send
// with the JMS headers of spec/stomp.md §4 and typed properties, subscribe with ack modes, prefetch and a
// channel API, ack/nack, receipts and transactions; heart-beats and reconnection keep a connection alive.
// Subpackages: stomp (the frame codec) and routing (group hash and routing).
//
// A Conn is a logical connection to a broker, safe for concurrent use.  Underneath, one STOMP connection
// at a time (a link) carries it: a reader goroutine owns its input, completes receipts and hands MESSAGE
// frames to their Subscription.  Every subscription uses broker credit (prefetch-count) and a buffer of
// exactly that size, so a slow reader never stalls the connection's receipts.  Every call takes a context;
// one without a deadline is bounded by Options.Timeout.
//
// Heart-beats are negotiated as STOMP 1.2 says (Options.HeartBeat, 10 s both ways by default): the client
// sends an EOL when it has written nothing for the negotiated interval, and declares the broker dead after
// twice the broker's interval without traffic.
//
// With Options.Reconnect, a lost link (socket error, EOF, missed heart-beats) is replaced with backoff, and
// every subscription is made again with the same id and headers.  What is lost, and what is not:
// unacknowledged messages go back to their queue when the link dies and the broker redelivers them
// (Redelivered, DeliveryCount counted up), so delivery is at least once; messages buffered but not yet
// received are dropped here for the same reason, and Ack/Nack of a message from the old link returns
// ErrStaleMessage; a request in flight (a Send waiting for its receipt) returns an error wrapping
// ErrDisconnected, and the message may or may not have arrived; open transactions are aborted by the broker
// (ErrTxLost); temporary queues die with the link; a non-durable topic subscription misses what was
// published while it was away (a durable one, with a ClientID, does not).  Calls made while reconnecting
// wait for the new link (within their context).  An ERROR frame is final: the broker refused something,
// and reconnecting would meet the same refusal.
package pymq

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/pymq/pymq/bindings/go/stomp"
)

// Status is where a Conn is in its life.
type Status int32

// The statuses of a Conn.
const (
	StatusConnecting Status = iota
	StatusOpen
	StatusReconnecting
	StatusClosed
)

func (s Status) String() string {
	return [...]string{"connecting", "open", "reconnecting", "closed"}[s]
}

// HeartBeat is what this side offers (spec/stomp.md §6): to send a beat every Send, and to receive one
// every Receive; 0 means never.  The broker's answer decides the intervals used (the larger of each pair).
type HeartBeat struct {
	Send, Receive time.Duration
}

// DefaultHeartBeat is offered when Options.HeartBeat is nil.
var DefaultHeartBeat = HeartBeat{Send: 10 * time.Second, Receive: 10 * time.Second}

// Reconnect configures reconnection with exponential backoff (with ±20 % jitter).
type Reconnect struct {
	InitialDelay time.Duration // first wait after a loss; default 100 ms
	MaxDelay     time.Duration // longest wait between attempts; default 10 s
	Multiplier   float64       // growth of the wait per failed attempt; default 2
	MaxAttempts  int           // attempts per loss before giving up (the Conn then fails); 0 = forever
	// Dial makes a new net.Conn.  Dial and DialContext fill it in; Connect (your own net.Conn) needs it
	// to reconnect.
	Dial func(ctx context.Context) (net.Conn, error)
}

// Options configure Dial, DialContext and Connect.  The zero value connects as guest (accepted from
// loopback only), with default heart-beats and no reconnection.
type Options struct {
	Login, Passcode string
	ClientID        string        // JMS client id: scopes durable subscriptions
	Version         string        // the one STOMP version to accept; "" accepts 1.1 and 1.2
	Host            string        // the CONNECT host header; "" sends "/"
	Timeout         time.Duration // bound of calls whose context has no deadline; default 10 s
	// AsyncSend makes Send return without waiting for the broker's receipt on persistent messages
	// (the default waits, so a returned Send means the message is durable and Message.ID is set).
	AsyncSend bool
	HeartBeat *HeartBeat  // nil: DefaultHeartBeat; &HeartBeat{} turns heart-beats off
	TLS       *tls.Config // Dial speaks TLS with this config (also implied by stomp+ssl:// addresses)
	Reconnect *Reconnect  // nil: a lost connection is final
	// OnStatus is told of every change of status, with the cause for reconnecting and closed.  It runs on
	// the goroutine that made the change and must not block.
	OnStatus func(Status, error)
}

func (o Options) timeout() time.Duration {
	if o.Timeout <= 0 {
		return 10 * time.Second
	}
	return o.Timeout
}

func (o Options) heartBeat() HeartBeat {
	if o.HeartBeat == nil {
		return DefaultHeartBeat
	}
	return *o.HeartBeat
}

// Stats counts what happened on a Conn.
type Stats struct {
	Reconnects         int64 // links replaced after a loss
	HeartBeatsSent     int64
	HeartBeatsReceived int64 // reads that carried only heart-beats
}

// Conn is a connection to a pymq broker.  It is safe for concurrent use.
type Conn struct {
	opts   Options
	redial func(ctx context.Context) (net.Conn, error)
	stats  Stats

	mu        sync.Mutex
	link      *link         // the link in use; nil while reconnecting
	ready     chan struct{} // closed while a link is in use
	gen       uint64        // generation of the link in use
	status    Status
	err       error // why the Conn ended (final)
	closing   bool
	closed    chan struct{}
	subs      map[string]*Subscription
	nextID    int
	closeOnce sync.Once
}

// Dial connects to addr and completes the STOMP handshake, within Options.Timeout.
// addr is "host:port", "stomp://host:port", or "stomp+ssl://host:port" (also "ssl://", "tls://") for TLS.
func Dial(addr string, opts Options) (*Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opts.timeout())
	defer cancel()
	return DialContext(ctx, addr, opts)
}

// DialContext is Dial within ctx.
func DialContext(ctx context.Context, addr string, opts Options) (*Conn, error) {
	hostport, useTLS := addr, opts.TLS != nil
	for _, prefix := range []string{"stomp+ssl://", "stomp+tls://", "ssl://", "tls://", "stomps://"} {
		if strings.HasPrefix(addr, prefix) {
			hostport, useTLS = strings.TrimPrefix(addr, prefix), true
		}
	}
	for _, prefix := range []string{"stomp://", "tcp://"} {
		hostport = strings.TrimPrefix(hostport, prefix)
	}
	cfg := opts.TLS
	if useTLS {
		if cfg == nil {
			cfg = &tls.Config{}
		} else {
			cfg = cfg.Clone()
		}
		if cfg.ServerName == "" {
			host, _, err := net.SplitHostPort(hostport)
			if err != nil {
				return nil, fmt.Errorf("pymq: bad address %q: %w", addr, err)
			}
			cfg.ServerName = host
		}
	}
	dial := func(ctx context.Context) (net.Conn, error) {
		var d net.Dialer
		nc, err := d.DialContext(ctx, "tcp", hostport)
		if err != nil {
			return nil, fmt.Errorf("pymq: cannot connect to %s: %w", hostport, err)
		}
		if !useTLS {
			return nc, nil
		}
		tc := tls.Client(nc, cfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			nc.Close()
			return nil, fmt.Errorf("pymq: TLS handshake with %s: %w", hostport, err)
		}
		return tc, nil
	}
	if opts.Reconnect != nil && opts.Reconnect.Dial == nil {
		r := *opts.Reconnect
		r.Dial = dial
		opts.Reconnect = &r
	}
	nc, err := dial(ctx)
	if err != nil {
		return nil, err
	}
	return Connect(ctx, nc, opts)
}

// Connect completes the STOMP handshake over nc, a connection you made (a proxy, a tunnel, an in-memory
// pipe in tests), within ctx.  To reconnect after a loss it needs Options.Reconnect.Dial.
func Connect(ctx context.Context, nc net.Conn, opts Options) (*Conn, error) {
	if opts.Login == "" {
		opts.Login, opts.Passcode = "guest", "guest"
	}
	c := &Conn{opts: opts, ready: make(chan struct{}), closed: make(chan struct{}),
		subs: map[string]*Subscription{}, status: StatusConnecting}
	if opts.Reconnect != nil {
		if opts.Reconnect.Dial == nil {
			nc.Close()
			return nil, errors.New("pymq: Options.Reconnect needs a Dial function to make new connections with Connect")
		}
		c.redial = opts.Reconnect.Dial
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.timeout())
		defer cancel()
	}
	l, err := c.handshake(ctx, nc, 1)
	if err != nil {
		return nil, err
	}
	c.publish(l)
	l.start()
	return c, nil
}

// publish makes l the link in use.
func (c *Conn) publish(l *link) {
	c.mu.Lock()
	c.link, c.gen, c.status = l, l.gen, StatusOpen
	close(c.ready)
	c.mu.Unlock()
	c.notify(StatusOpen, nil)
}

func (c *Conn) notify(s Status, err error) {
	if f := c.opts.OnStatus; f != nil {
		f(s, err)
	}
}

// Version is the negotiated STOMP version of the link in use.
func (c *Conn) Version() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.link == nil {
		return ""
	}
	return c.link.version
}

// Session is the broker's id for the link in use.
func (c *Conn) Session() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.link == nil {
		return ""
	}
	return c.link.session
}

// Status is where the connection is now.
func (c *Conn) Status() Status {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.status
}

// HeartBeats are the negotiated intervals of the link in use: this side sends every send, and expects
// the broker's traffic every receive (0: none).
func (c *Conn) HeartBeats() (send, receive time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.link == nil {
		return 0, 0
	}
	return c.link.sendEvery, c.link.expectEvery
}

// Stats returns the counters so far.
func (c *Conn) Stats() Stats {
	return Stats{Reconnects: atomic.LoadInt64(&c.stats.Reconnects),
		HeartBeatsSent: atomic.LoadInt64(&c.stats.HeartBeatsSent), HeartBeatsReceived: atomic.LoadInt64(&c.stats.HeartBeatsReceived)}
}

// Err is why the connection ended (nil while it is open or reconnecting).
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Done is closed when the connection has ended for good.
func (c *Conn) Done() <-chan struct{} { return c.closed }

func (c *Conn) id(prefix string) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nextID++
	return prefix + strconv.Itoa(c.nextID)
}

// bounded gives ctx the connection's Timeout when it has no deadline.
func (c *Conn) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return ctx, func() {}
	}
	return context.WithTimeout(ctx, c.opts.timeout())
}

// current returns the link in use, waiting (within ctx) while the connection is reconnecting.
func (c *Conn) current(ctx context.Context) (*link, error) {
	for {
		c.mu.Lock()
		l, ready, err := c.link, c.ready, c.err
		c.mu.Unlock()
		if err != nil {
			return nil, err
		}
		if l != nil && !l.failed() {
			return l, nil
		}
		if l != nil { // failed, and linkLost has not run yet: let it
			select {
			case <-c.closed:
			case <-ctx.Done():
				return nil, fmt.Errorf("pymq: waiting for the connection: %w", ctx.Err())
			case <-time.After(time.Millisecond):
			}
			continue
		}
		select {
		case <-ready:
		case <-c.closed:
		case <-ctx.Done():
			return nil, fmt.Errorf("pymq: waiting for the connection: %w", ctx.Err())
		}
	}
}

// fail ends the connection for good with err.
func (c *Conn) fail(err error) {
	c.closeOnce.Do(func() {
		c.mu.Lock()
		c.err = err
		c.status = StatusClosed
		l := c.link
		c.link = nil // so that its failure below is not taken for a loss to recover from
		subs := make([]*Subscription, 0, len(c.subs))
		for _, s := range c.subs {
			subs = append(subs, s)
		}
		c.mu.Unlock()
		close(c.closed)
		if l != nil {
			l.fail(err)
		}
		for _, s := range subs {
			s.end()
		}
		c.notify(StatusClosed, err)
	})
}

// linkLost runs once per link when it fails: reconnect, or end the connection.
func (c *Conn) linkLost(l *link, err error) {
	c.mu.Lock()
	if c.link != l {
		c.mu.Unlock()
		return // a link that never went into use, or one already replaced
	}
	c.link = nil
	c.ready = make(chan struct{})
	closing := c.closing
	var se *ServerError
	final := closing || c.redial == nil || errors.As(err, &se) || c.err != nil
	if !final {
		c.status = StatusReconnecting
	}
	c.mu.Unlock()
	if closing {
		c.fail(ErrClosed)
		return
	}
	if final {
		if !errors.As(err, &se) {
			err = disconnectedBy(err)
		}
		c.fail(err)
		return
	}
	c.notify(StatusReconnecting, err)
	go c.reconnect(l.gen + 1)
}

// reconnect replaces the lost link with backoff, and subscribes every subscription again on the new one
// before it goes into use (so no call sees a half-restored connection).
func (c *Conn) reconnect(gen uint64) {
	r := c.opts.Reconnect
	delay := r.InitialDelay
	if delay <= 0 {
		delay = 100 * time.Millisecond
	}
	maxDelay := r.MaxDelay
	if maxDelay <= 0 {
		maxDelay = 10 * time.Second
	}
	mult := r.Multiplier
	if mult < 1 {
		mult = 2
	}
	var last error
	for attempt := 1; r.MaxAttempts == 0 || attempt <= r.MaxAttempts; attempt++ {
		jitter := time.Duration((rand.Float64()*0.4 - 0.2) * float64(delay))
		select {
		case <-c.closed:
			return
		case <-time.After(delay + jitter):
		}
		delay = time.Duration(float64(delay) * mult)
		if delay > maxDelay {
			delay = maxDelay
		}
		l, err := c.restore(gen)
		if err == nil {
			atomic.AddInt64(&c.stats.Reconnects, 1)
			c.mu.Lock()
			if c.err != nil { // closed meanwhile
				c.mu.Unlock()
				l.fail(ErrClosed)
				return
			}
			c.mu.Unlock()
			c.publish(l)
			return
		}
		last = err
		var se *ServerError
		if errors.As(err, &se) { // refused, not unreachable: trying again meets the same answer
			c.fail(err)
			return
		}
	}
	c.fail(disconnectedBy(fmt.Errorf("gave up after %d attempts: %w", r.MaxAttempts, last)))
}

// restore dials, completes the handshake and subscribes again; the link is running but not in use yet.
func (c *Conn) restore(gen uint64) (*link, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.timeout())
	defer cancel()
	nc, err := c.redial(ctx)
	if err != nil {
		return nil, err
	}
	l, err := c.handshake(ctx, nc, gen)
	if err != nil {
		return nil, err
	}
	l.start()
	c.mu.Lock()
	subs := make([]*Subscription, 0, len(c.subs))
	for _, s := range c.subs {
		subs = append(subs, s)
	}
	c.mu.Unlock()
	for _, s := range subs {
		if _, err := l.request(ctx, "SUBSCRIBE", s.headers, nil); err != nil {
			l.fail(err)
			return nil, err
		}
	}
	return l, nil
}

// deliver hands a MESSAGE frame to its subscription (reader goroutine).
func (c *Conn) deliver(l *link, f *stomp.Frame) {
	c.mu.Lock()
	sub := c.subs[f.Value("subscription")]
	c.mu.Unlock()
	if sub != nil {
		sub.deliver(l, f)
	}
}

// request sends a frame with a receipt on the link in use and waits for the RECEIPT.  A RECEIPT confirms
// every earlier frame of the link.
func (c *Conn) request(ctx context.Context, command string, headers []stomp.Header, body []byte) (*stomp.Frame, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	l, err := c.current(ctx)
	if err != nil {
		return nil, err
	}
	return l.request(ctx, command, headers, body)
}

// write sends a frame without a receipt on the link in use.
func (c *Conn) write(ctx context.Context, command string, headers []stomp.Header, body []byte) error {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	l, err := c.current(ctx)
	if err != nil {
		return err
	}
	return l.write(ctx, command, headers, body)
}

// Send sends m to destination ("/queue/x", "/topic/x", "/temp-queue/x").  A persistent message waits for
// the broker's receipt (it is then durable) and gets its ID, unless Options.AsyncSend is set.
func (c *Conn) Send(ctx context.Context, destination string, m *Message) error {
	return c.send(ctx, destination, m, nil)
}

func (c *Conn) send(ctx context.Context, destination string, m *Message, tx *Tx) error {
	if m.Priority < 0 || m.Priority > 9 {
		return fmt.Errorf("pymq: priority must be between 0 and 9, got %d", m.Priority)
	}
	if m.Timestamp == 0 {
		m.Timestamp = nowMillis()
	}
	m.Destination = destination
	headers := append([]stomp.Header{{Name: "destination", Value: destination}}, m.sendHeaders()...)
	if tx != nil {
		l, cancel, err := tx.link(ctx)
		if err != nil {
			return err
		}
		defer cancel()
		return l.write(ctx, "SEND", append(headers, stomp.Header{Name: "transaction", Value: tx.ID}), m.Body)
	}
	if m.NonPersistent || c.opts.AsyncSend {
		return c.write(ctx, "SEND", headers, m.Body)
	}
	receipt, err := c.request(ctx, "SEND", headers, m.Body)
	if err != nil {
		return err
	}
	m.ID = receipt.Value("message-id")
	return nil
}

// Close disconnects gracefully, within Options.Timeout: see CloseContext.
func (c *Conn) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.timeout())
	defer cancel()
	return c.CloseContext(ctx)
}

// CloseContext disconnects gracefully: DISCONNECT, wait for its receipt (every earlier frame is then
// processed), close the socket, stop reconnecting.  The broker returns unacknowledged messages to their
// queues.
func (c *Conn) CloseContext(ctx context.Context) error {
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return nil
	}
	c.closing = true
	l := c.link
	subs := make([]*Subscription, 0, len(c.subs))
	for _, s := range c.subs {
		subs = append(subs, s)
	}
	c.mu.Unlock()
	// a subscription nobody reads may have stopped the reader: release them all so the RECEIPT gets
	// through (unacknowledged messages go back to their queues on the broker anyway)
	for _, s := range subs {
		s.end()
	}
	var err error
	if l != nil && !l.failed() {
		_, err = l.request(ctx, "DISCONNECT", nil, nil)
	}
	c.fail(ErrClosed)
	if err != nil && !errors.Is(err, ErrClosed) {
		return err
	}
	return nil
}
