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
// With a failover URL (spec/ha.md §4: "failover:(stomp://a,stomp://b)?options" or a comma list) or
// Options.Reconnect, a lost link (socket error, EOF, missed heart-beats) is replaced with backoff, every
// subscription is made again with the same id and headers, and the SENDs without their receipt go again
// with their pymq-dedup-id (the broker drops a copy it has).  What is lost, and what is not:
// unacknowledged messages go back to their queue when the link dies and the broker redelivers them
// (Redelivered, DeliveryCount counted up), so delivery is at least once; messages buffered but not yet
// received are dropped here for the same reason, and Ack/Nack of a message from the old link returns
// ErrStaleMessage; a transaction that did something is rolled back by the broker (its Commit returns
// ErrTxLost; a Commit whose receipt was lost, ErrTxInDoubt); temporary queues and topics keep their global
// names (the reconnection offers the broker's re-claim token, spec/ha.md §4.7; OnStatus gets
// *TemporariesRenamed with StatusOpen when they could not), but what a temporary queue held is lost with a
// broker that died, and a
// non-durable topic subscription misses what was published while it was away (a durable one, with a
// ClientID, does not).  Calls made while reconnecting wait for the new link (within their context).  An
// ERROR frame is final: the broker refused something, and reconnecting would meet the same refusal.
package pymq

import (
	"context"
	crand "crypto/rand"
	"crypto/tls"
	"encoding/hex"
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
	ClientID        string // JMS client id: scopes durable subscriptions
	Version         string // the one STOMP version to accept; "" accepts 1.1 and 1.2
	Host            string // the CONNECT host header; "" sends "/" (VHost wins)
	// VHost selects the broker's virtual host (spec/stomp.md §1), sent as host:/<VHost>, at every broker
	// whose URL has no path: a path ("stomp://host:61613/shop", also a failover member's) wins for its
	// broker (VHostAt).  "" is the broker's default vhost "/".
	VHost   string
	Timeout time.Duration // bound of calls whose context has no deadline; default 10 s
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

	// failover (spec/ha.md §4): the back-off, the group's members, and the SENDs without their receipt
	fo      *FailoverOptions
	picker  *picker
	connID  string
	sendSeq atomic.Int64
	sendMu  sync.Mutex
	window  []*pendingSend
	slots   chan struct{} // one per SEND in the window
	// the pymq-reclaim-token of the last CONNECTED (spec/ha.md §4.7), offered by the next reconnection's
	// CONNECT; a secret of this connection: never logged, never in an error (guarded by mu)
	reclaimToken string
}

// TemporariesRenamed is the error OnStatus gets with StatusOpen after a reconnection whose link did not
// re-claim the lost link's temporary names (spec/ha.md §4.7): its temporary queues and topics have new
// global names, so a reply addressed to an old one (a reply-to sent before the loss) does not reach them;
// the application may ask again.  Reason is the broker's pymq-reclaim-refused, or why nothing was offered.
type TemporariesRenamed struct{ Reason string }

func (e *TemporariesRenamed) Error() string {
	return "pymq: the temporary destinations have new global names after the reconnection: " + e.Reason
}

func (c *Conn) reclaimTokenNow() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reclaimToken
}

// keepReclaimToken keeps the token of a CONNECTED (an empty one, from a broker with temporary_reclaim_ms 0,
// forgets the last).
func (c *Conn) keepReclaimToken(token string) {
	c.mu.Lock()
	c.reclaimToken = token
	c.mu.Unlock()
}

// SendWindow is how many SENDs of a reconnecting connection may wait for their receipt; Send blocks
// (within its context) while that many do.
const SendWindow = 1000

// Dial connects to addr and completes the STOMP handshake, within Options.Timeout.
// addr is "host:port", "stomp://host:port", or "stomp+ssl://host:port" (also "ssl://", "tls://") for TLS.
func Dial(addr string, opts Options) (*Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), opts.timeout())
	defer cancel()
	return DialContext(ctx, addr, opts)
}

// DialContext is Dial within ctx.  A failover URL ("failover:(stomp://a:61613,stomp://b:61613)?options" or
// "stomp://a:61613,stomp://b:61613", spec/ha.md §4) connects to the first broker of the group that answers
// and fails over between them (its options replace Options.Reconnect's).
func DialContext(ctx context.Context, addr string, opts Options) (*Conn, error) {
	if isGroupURL(addr) {
		g, err := ParseBrokerURL(addr)
		if err != nil {
			return nil, err
		}
		return dialGroup(ctx, g, opts)
	}
	hostport, useTLS := addr, opts.TLS != nil
	for _, prefix := range []string{"stomp+ssl://", "stomp+tls://", "ssl://", "tls://", "stomps://"} {
		if strings.HasPrefix(addr, prefix) {
			hostport, useTLS = strings.TrimPrefix(addr, prefix), true
		}
	}
	for _, prefix := range []string{"stomp://", "tcp://"} {
		hostport = strings.TrimPrefix(hostport, prefix)
	}
	if i := strings.IndexByte(hostport, '/'); i >= 0 && strings.Contains(addr, "://") {
		vhost, err := vhostOfPath(hostport[i:])
		if err != nil {
			return nil, fmt.Errorf("pymq: %s: %w", redacted(addr), err)
		}
		hostport = hostport[:i]
		opts.VHost = opts.VHostAt(Broker{VHost: vhost}) // the URL's path wins (spec/stomp.md §1)
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
	c := newConn(opts)
	if opts.Reconnect != nil {
		if opts.Reconnect.Dial == nil {
			nc.Close()
			return nil, errors.New("pymq: Options.Reconnect needs a Dial function to make new connections with Connect")
		}
		c.redial = opts.Reconnect.Dial
		c.fo = opts.Reconnect.failoverOptions()
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

func newConn(opts Options) *Conn {
	var id [8]byte
	_, _ = crand.Read(id[:])
	return &Conn{opts: opts, ready: make(chan struct{}), closed: make(chan struct{}),
		subs: map[string]*Subscription{}, status: StatusConnecting, connID: hex.EncodeToString(id[:]),
		slots: make(chan struct{}, SendWindow)}
}

// failoverOptions are Reconnect's settings as spec/ha.md §4.2's options (the first attempt after a loss
// is immediate; ±20 % jitter).
func (r *Reconnect) failoverOptions() *FailoverOptions {
	o := DefaultFailoverOptions
	o.InitialReconnectDelay, o.MaxReconnectDelay = 100, 10000
	if r.InitialDelay > 0 {
		o.InitialReconnectDelay = int(r.InitialDelay.Milliseconds())
	}
	if r.MaxDelay > 0 {
		o.MaxReconnectDelay = int(r.MaxDelay.Milliseconds())
	}
	if r.Multiplier >= 1 {
		o.BackOffMultiplier = r.Multiplier
	}
	if r.MaxAttempts > 0 {
		o.MaxReconnectAttempts = r.MaxAttempts
	}
	return &o
}

// isGroupURL: a failover URL or a comma list (a single address keeps its own grammar).
func isGroupURL(addr string) bool {
	t := strings.TrimSpace(addr)
	return strings.Contains(t, ",") || (len(t) >= 9 && strings.EqualFold(t[:9], "failover:"))
}

// dialGroup connects to the first member of g that answers: (1 + StartupMaxReconnectAttempts) passes over
// the list (-1: until one answers), with the back-off between attempts.  A broker that refuses the login is
// final.
func dialGroup(ctx context.Context, g *BrokerGroup, opts Options) (*Conn, error) {
	c := newConn(opts)
	o := g.Options
	c.picker = newPicker(g, opts.TLS)
	c.fo = &o
	if o.MaxReconnectAttempts != 0 {
		c.redial = c.picker.dial
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, opts.timeout())
		defer cancel()
	}
	var last error
	attempt := 0
	for pass := 0; o.StartupMaxReconnectAttempts < 0 || pass <= o.StartupMaxReconnectAttempts; pass++ {
		for k := 0; k < len(g.Brokers); k++ {
			attempt++
			select {
			case <-ctx.Done():
				if last == nil {
					last = ctx.Err()
				}
				return nil, last
			case <-time.After(o.jittered(attempt, c.picker.rnd)):
			}
			actx, cancel := o.attempt(ctx)
			nc, err := c.picker.dial(actx)
			if err != nil {
				cancel()
				last = err
				continue
			}
			l, err := c.handshake(actx, nc, 1)
			cancel()
			if err != nil {
				var se *ServerError
				if errors.As(err, &se) {
					return nil, err
				}
				last = err
				continue
			}
			c.publish(l)
			l.start()
			return c, nil
		}
	}
	return nil, last
}

// publish makes l the link in use.
func (c *Conn) publish(l *link) {
	c.mu.Lock()
	c.link, c.gen, c.status = l, l.gen, StatusOpen
	close(c.ready)
	c.mu.Unlock()
	var renamed error
	if l.gen > 1 && l.reclaimed != "true" { // a reconnection that kept no temporary names
		why := l.reclaimRefused
		if why == "" {
			why = "no re-claim was offered or answered (a broker with temporary_reclaim_ms: 0 gives no token)"
		}
		renamed = &TemporariesRenamed{Reason: why}
	}
	c.notify(StatusOpen, renamed)
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
		var limit <-chan time.Time // the failover timeout option bounds a wait for the next link
		if c.fo != nil && c.fo.Timeout >= 0 {
			t := time.NewTimer(time.Duration(c.fo.Timeout) * time.Millisecond)
			defer t.Stop()
			limit = t.C
		}
		select {
		case <-ready:
		case <-c.closed:
		case <-limit:
			return nil, fmt.Errorf("%w: still reconnecting after %d ms (the failover timeout)", ErrDisconnected, c.fo.Timeout)
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
		c.sendMu.Lock()
		window := c.window
		c.window = nil
		c.sendMu.Unlock()
		for _, p := range window {
			p.finish(nil, err)
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

// reconnect replaces the lost link with the back-off of spec/ha.md §4.2, and makes the connection whole on
// the new one (subscriptions, then the unreceipted SENDs) before it goes into use, so no call sees a
// half-restored connection.
func (c *Conn) reconnect(gen uint64) {
	o := c.fo
	rnd := rand.New(rand.NewSource(time.Now().UnixNano()))
	var last error
	attempt := 0
	for ; o.MaxReconnectAttempts < 0 || attempt < o.MaxReconnectAttempts; attempt++ {
		select {
		case <-c.closed:
			return
		case <-time.After(o.jittered(attempt+1, rnd)):
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
			// the unreceipted SENDs go again first, in order, with their dedup ids; then the link is in use
			c.sendMu.Lock()
			for _, p := range c.window {
				c.transmit(p, l)
			}
			c.publish(l)
			c.sendMu.Unlock()
			return
		}
		last = err
		var se *ServerError
		// refused, not unreachable: trying again meets the same answer; except a client id (or durable
		// subscription) the broker still holds for the lost link it has not seen die yet (a half-open TCP
		// connection ends at its heart-beat deadline): that passes, so it is tried again
		if errors.As(err, &se) && se.Code != "illegal-state" {
			c.fail(err)
			return
		}
	}
	c.fail(disconnectedBy(fmt.Errorf("gave up after %d attempts: %w", attempt, last)))
}

// restore dials, completes the handshake and subscribes again; the link is running but not in use yet.
func (c *Conn) restore(gen uint64) (*link, error) {
	ctx, cancel := context.WithTimeout(context.Background(), c.opts.timeout())
	defer cancel()
	actx, cancelAttempt := ctx, context.CancelFunc(func() {})
	if c.fo != nil {
		actx, cancelAttempt = c.fo.attempt(ctx) // a group's connectionTimeout (spec/ha.md §4.2)
	}
	defer cancelAttempt()
	nc, err := c.redial(actx)
	if err != nil {
		return nil, err
	}
	l, err := c.handshake(actx, nc, gen)
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
		tx.did()
		return l.write(ctx, "SEND", append(headers, stomp.Header{Name: "transaction", Value: tx.ID}), m.Body)
	}
	if c.fo != nil {
		return c.sendReliably(ctx, headers, m)
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

// pendingSend is a SEND of a reconnecting connection waiting for its receipt (spec/ha.md §4.4).
type pendingSend struct {
	headers []stomp.Header
	body    []byte
	done    chan struct{}
	once    sync.Once
	frame   *stomp.Frame
	err     error
	sent    bool // written on some link (guarded by Conn.sendMu)
}

func (p *pendingSend) finish(f *stomp.Frame, err error) {
	p.once.Do(func() {
		p.frame, p.err = f, err
		close(p.done)
	})
}

// sendReliably sends through the window: the SEND carries a pymq-dedup-id (the message's DedupID, else
// "<connection>:<n>") and asks for a receipt; after a reconnect it goes again with the same id, and the
// broker drops a copy it already has.  A persistent Send (without AsyncSend) waits for the receipt.
func (c *Conn) sendReliably(ctx context.Context, headers []stomp.Header, m *Message) error {
	if m.DedupID == "" {
		m.DedupID = c.connID + ":" + strconv.FormatInt(c.sendSeq.Add(1), 10)
		headers = append(headers, stomp.Header{Name: "pymq-dedup-id", Value: m.DedupID})
	}
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	select {
	case c.slots <- struct{}{}:
	case <-c.closed:
		return c.Err()
	case <-ctx.Done():
		return fmt.Errorf("pymq: %d sends wait for their receipt: %w", SendWindow, ctx.Err())
	}
	p := &pendingSend{headers: headers, body: m.Body, done: make(chan struct{})}
	c.sendMu.Lock()
	if err := c.Err(); err != nil {
		c.sendMu.Unlock()
		<-c.slots
		return err
	}
	c.window = append(c.window, p)
	c.mu.Lock()
	l := c.link
	c.mu.Unlock()
	if l != nil && !l.failed() {
		c.transmit(p, l)
	}
	c.sendMu.Unlock()
	if m.NonPersistent || c.opts.AsyncSend {
		return nil
	}
	select {
	case <-p.done:
		if p.err != nil {
			return p.err
		}
		m.ID = p.frame.Value("message-id")
		return nil
	case <-ctx.Done():
		c.sendMu.Lock()
		never := !p.sent
		if never { // it never left: withdrawn, so a late reconnect does not send what the caller gave up on
			c.dropLocked(p)
		}
		c.sendMu.Unlock()
		if never {
			p.finish(nil, ctx.Err())
			return fmt.Errorf("pymq: SEND not sent: %w", ctx.Err())
		}
		return fmt.Errorf("pymq: no RECEIPT for SEND (it goes again with its dedup id after a reconnect): %w", ctx.Err())
	}
}

// transmit writes p on l (under sendMu, so SENDs keep their order); its receipt settles it, a loss leaves
// it in the window for the next link.
func (c *Conn) transmit(p *pendingSend, l *link) {
	p.sent = true
	wait, err := l.submit(context.Background(), "SEND", p.headers, p.body)
	if err != nil {
		if !errors.Is(err, ErrDisconnected) {
			c.settle(p, nil, err)
		}
		return
	}
	go func() {
		f, err := wait()
		if err == nil || !errors.Is(err, ErrDisconnected) {
			c.settle(p, f, err)
		}
	}()
}

func (c *Conn) settle(p *pendingSend, f *stomp.Frame, err error) {
	c.sendMu.Lock()
	c.dropLocked(p)
	c.sendMu.Unlock()
	p.finish(f, err)
}

// dropLocked takes p out of the window (under sendMu).
func (c *Conn) dropLocked(p *pendingSend) {
	for i, q := range c.window {
		if q == p {
			c.window = append(c.window[:i:i], c.window[i+1:]...)
			<-c.slots
			return
		}
	}
}
