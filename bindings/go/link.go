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
	"sync/atomic"
	"time"

	"github.com/pymq/pymq/bindings/go/stomp"
)

// A link is one STOMP connection over one net.Conn: the handshake, a reader goroutine that owns the
// input, serialised writes, and the heart-beat timer.  It fails exactly once (ERROR frame, lost socket,
// missed heart-beats, a write cut short); its Conn then decides whether to reconnect.
type link struct {
	c       *Conn
	nc      net.Conn
	gen     uint64
	version string
	session string
	// temporary names (spec/ha.md §4.7): CONNECTED's pymq-reclaimed ("true" when this link re-claimed the
	// lost link's temporaries' global names) and pymq-reclaim-refused (why not)
	reclaimed, reclaimRefused string
	// negotiated heart-beats (spec/stomp.md §6): this side sends every sendEvery, expects every expectEvery
	sendEvery, expectEvery time.Duration

	writeMu     sync.Mutex
	deadlineMu  sync.Mutex
	activeWrite uint64 // the write a context watcher may cut short (0: none)
	writes      uint64

	mu       sync.Mutex
	receipts map[string]chan *stomp.Frame
	err      error
	done     chan struct{}
	failOnce sync.Once

	lastRead, lastWrite atomic.Int64 // unix nanoseconds
	scanner             *stomp.Scanner
}

// heartBeatGrace: the broker is declared dead after this many receive intervals without traffic (as the
// broker itself does with its clients).
const heartBeatGrace = 2

func parseHeartBeat(v string) (time.Duration, time.Duration) {
	a, b, ok := strings.Cut(v, ",")
	if !ok {
		return 0, 0
	}
	x, err1 := strconv.ParseInt(strings.TrimSpace(a), 10, 64)
	y, err2 := strconv.ParseInt(strings.TrimSpace(b), 10, 64)
	if err1 != nil || err2 != nil || x < 0 || y < 0 || x > 1<<31 || y > 1<<31 {
		return 0, 0
	}
	return time.Duration(x) * time.Millisecond, time.Duration(y) * time.Millisecond
}

// negotiate returns (send every, expect every) from what this side offered and what the broker answered:
// max of the two sides' values, or 0 when either says 0 (STOMP 1.2).
func negotiate(offer HeartBeat, cx, cy time.Duration) (time.Duration, time.Duration) {
	var send, expect time.Duration
	if offer.Send > 0 && cy > 0 {
		send = offer.Send
		if cy > send {
			send = cy
		}
	}
	if offer.Receive > 0 && cx > 0 {
		expect = offer.Receive
		if cx > expect {
			expect = cx
		}
	}
	return send, expect
}

// handshake sends CONNECT over nc and waits for CONNECTED, within ctx (cancelling ctx closes nc).  An
// ERROR answer is returned as its *ServerError.
func (c *Conn) handshake(ctx context.Context, nc net.Conn, gen uint64) (*link, error) {
	opts := c.opts
	hb := opts.heartBeat()
	accept := opts.Version
	if accept == "" {
		accept = "1.1,1.2"
	}
	host := opts.Host
	vhost := opts.VHost
	if c.picker != nil {
		vhost = c.picker.vhost(opts)
	}
	if vhost != "" {
		host = "/" + vhost // spec/stomp.md §1: the virtual host
	} else if host == "" {
		host = "/"
	}
	login, passcode := opts.Login, opts.Passcode
	if c.picker != nil {
		login, passcode = c.picker.credentials(opts)
	}
	if login == "" {
		login, passcode = "guest", "guest"
	}
	headers := []stomp.Header{{Name: "accept-version", Value: accept}, {Name: "host", Value: host},
		{Name: "login", Value: login}, {Name: "passcode", Value: passcode},
		{Name: "heart-beat", Value: fmt.Sprintf("%d,%d", hb.Send.Milliseconds(), hb.Receive.Milliseconds())}}
	if opts.ClientID != "" {
		headers = append(headers, stomp.Header{Name: "client-id", Value: opts.ClientID})
	}
	if token := c.reclaimTokenNow(); token != "" && c.fo != nil {
		// a reconnection offers the token of the last CONNECTED: its temporaries keep their global names
		headers = append(headers, stomp.Header{Name: "pymq-reclaim", Value: token})
	}
	data, err := stomp.Encode("CONNECT", headers, nil, stomp.V12)
	if err != nil {
		nc.Close()
		return nil, err
	}
	// a cancelled context must not leave the handshake blocked in Read or Write: a watcher cuts it short by
	// moving the deadline into the past, unless the handshake has finished (under the same lock), since the
	// context is typically cancelled right after a successful one and the link must not inherit the deadline
	var cutMu sync.Mutex
	finished := false
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		select {
		case <-ctx.Done():
			cutMu.Lock()
			if !finished {
				_ = nc.SetDeadline(time.Unix(1, 0))
			}
			cutMu.Unlock()
		case <-stop:
		}
	}()
	fail := func(err error) (*link, error) {
		nc.Close()
		if ctx.Err() != nil { // the watcher above cut the read or write
			return nil, fmt.Errorf("pymq: CONNECT: %w", ctx.Err())
		}
		return nil, err
	}
	if _, err := nc.Write(data); err != nil {
		return fail(fmt.Errorf("pymq: CONNECT: %w", err))
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
				return fail(fmt.Errorf("pymq: CONNECT: %w", ferr))
			}
			if len(frames) > 0 {
				first = &frames[0]
			}
		}
		if err != nil && first == nil {
			return fail(fmt.Errorf("pymq: CONNECT: no answer from the broker: %w", err))
		}
	}
	if first.Command == "ERROR" {
		return fail(serverError(first))
	}
	if first.Command != "CONNECTED" {
		return fail(fmt.Errorf("pymq: expected CONNECTED, got %s", first.Command))
	}
	cutMu.Lock()
	finished = true
	cut := ctx.Err() != nil
	_ = nc.SetDeadline(time.Time{})
	cutMu.Unlock()
	if cut { // the watcher may have moved the deadline before finished was set: start again cleanly
		return fail(ctx.Err())
	}
	l := &link{c: c, nc: nc, gen: gen, version: first.Value("version"), session: first.Value("session"),
		reclaimed: first.Value("pymq-reclaimed"), reclaimRefused: first.Value("pymq-reclaim-refused"),
		receipts: map[string]chan *stomp.Frame{}, done: make(chan struct{}), scanner: scanner}
	c.keepReclaimToken(first.Value("pymq-reclaim-token"))
	if l.version == "" {
		l.version = stomp.V10
	}
	cx, cy := parseHeartBeat(first.Value("heart-beat"))
	l.sendEvery, l.expectEvery = negotiate(hb, cx, cy)
	now := time.Now().UnixNano()
	l.lastRead.Store(now)
	l.lastWrite.Store(now)
	scanner.Version = l.version
	return l, nil
}

// start runs the reader and, when heart-beats were negotiated, the heart-beat timer.
func (l *link) start() {
	go l.readLoop()
	if l.sendEvery > 0 || l.expectEvery > 0 {
		go l.heartBeats()
	}
}

func (l *link) heartBeats() {
	every := l.sendEvery
	if every == 0 || (l.expectEvery > 0 && l.expectEvery < every) {
		every = l.expectEvery
	}
	tick := every / 4
	if tick < 10*time.Millisecond {
		tick = 10 * time.Millisecond
	}
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-l.done:
			return
		case now := <-t.C:
			if l.expectEvery > 0 && now.UnixNano()-l.lastRead.Load() > int64(heartBeatGrace*l.expectEvery) {
				l.fail(fmt.Errorf("%w for %v (one expected every %v)", ErrHeartBeat,
					time.Duration(now.UnixNano()-l.lastRead.Load()).Round(time.Millisecond), l.expectEvery))
				return
			}
			if l.sendEvery > 0 && now.UnixNano()-l.lastWrite.Load() >= int64(l.sendEvery*3/4) {
				if l.writeMu.TryLock() { // a write in progress is traffic enough
					_ = l.nc.SetWriteDeadline(time.Now().Add(l.c.opts.timeout()))
					_, err := l.nc.Write([]byte{'\n'})
					if err == nil {
						l.lastWrite.Store(time.Now().UnixNano())
						atomic.AddInt64(&l.c.stats.HeartBeatsSent, 1)
					}
					l.writeMu.Unlock()
					if err != nil {
						l.fail(fmt.Errorf("pymq: heart-beat write failed: %w", err))
						return
					}
				}
			}
		}
	}
}

func (l *link) readLoop() {
	buf := make([]byte, 64<<10)
	frames, err := l.scanner.Feed(nil) // frames that came with CONNECTED
	for i := range frames {
		l.dispatch(&frames[i])
	}
	if err != nil {
		l.fail(fmt.Errorf("pymq: the broker sent a malformed frame: %w", err))
		return
	}
	for {
		n, err := l.nc.Read(buf)
		if n > 0 {
			l.lastRead.Store(time.Now().UnixNano())
			if isHeartBeat(buf[:n]) {
				atomic.AddInt64(&l.c.stats.HeartBeatsReceived, 1)
			}
			frames, ferr := l.scanner.Feed(buf[:n])
			for i := range frames {
				l.dispatch(&frames[i])
			}
			if ferr != nil {
				l.fail(fmt.Errorf("pymq: the broker sent a malformed frame: %w", ferr))
				return
			}
		}
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, net.ErrClosed) {
				l.fail(errors.New("pymq: the broker closed the connection"))
			} else {
				l.fail(fmt.Errorf("pymq: connection lost: %w", err))
			}
			return
		}
	}
}

func isHeartBeat(b []byte) bool {
	for _, c := range b {
		if c != '\n' && c != '\r' {
			return false
		}
	}
	return true
}

func (l *link) dispatch(f *stomp.Frame) {
	switch f.Command {
	case "RECEIPT":
		id := f.Value("receipt-id")
		l.mu.Lock()
		ch := l.receipts[id]
		delete(l.receipts, id)
		l.mu.Unlock()
		if ch != nil {
			ch <- f
		}
	case "MESSAGE":
		l.c.deliver(l, f)
	case "ERROR":
		l.fail(serverError(f))
	}
}

// fail ends the link once: every request waiting on it sees done, and the Conn decides what comes next.
func (l *link) fail(err error) {
	l.failOnce.Do(func() {
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
		close(l.done)
		l.nc.Close()
		l.c.linkLost(l, err)
	})
}

// lostErr is what a request waiting on a failed link returns: the broker's ERROR as it is, anything
// else wrapped in ErrDisconnected.
func (l *link) lostErr() error {
	l.mu.Lock()
	err := l.err
	l.mu.Unlock()
	var se *ServerError
	if errors.As(err, &se) || errors.Is(err, ErrClosed) {
		return err
	}
	return disconnectedBy(err)
}

func (l *link) failed() bool {
	select {
	case <-l.done:
		return true
	default:
		return false
	}
}

// write sends one frame within ctx.  A write cut short (deadline, cancellation, socket error) may have
// sent part of a frame, after which the stream cannot go on: the link fails.
func (l *link) write(ctx context.Context, command string, headers []stomp.Header, body []byte) error {
	data, err := stomp.Encode(command, headers, body, l.version)
	if err != nil {
		return err
	}
	if l.failed() {
		return l.lostErr()
	}
	l.writeMu.Lock()
	defer l.writeMu.Unlock()
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(l.c.opts.timeout())
	}
	l.deadlineMu.Lock()
	l.writes++
	seq := l.writes
	l.activeWrite = seq
	_ = l.nc.SetWriteDeadline(deadline)
	l.deadlineMu.Unlock()
	finished := make(chan struct{})
	if ctx.Done() != nil {
		go func() {
			select {
			case <-ctx.Done():
				l.deadlineMu.Lock()
				if l.activeWrite == seq {
					_ = l.nc.SetWriteDeadline(time.Unix(1, 0))
				}
				l.deadlineMu.Unlock()
			case <-finished:
			}
		}()
	}
	_, err = l.nc.Write(data)
	l.deadlineMu.Lock()
	l.activeWrite = 0
	l.deadlineMu.Unlock()
	close(finished)
	if err != nil {
		l.fail(fmt.Errorf("pymq: write failed: %w", err))
		if _, has := ctx.Deadline(); has && ctx.Err() == nil && time.Now().After(deadline) {
			<-ctx.Done() // the socket's deadline was the context's: its error is due
		}
		if ctx.Err() != nil {
			return fmt.Errorf("pymq: %s cut short, which ends the connection: %w", command, ctx.Err())
		}
		return l.lostErr()
	}
	l.lastWrite.Store(time.Now().UnixNano())
	return nil
}

// submit writes a frame with a receipt header now and returns how to wait for its RECEIPT (until the
// RECEIPT or the link's failure).
func (l *link) submit(ctx context.Context, command string, headers []stomp.Header, body []byte) (func() (*stomp.Frame, error), error) {
	id := l.c.id("r-")
	ch := make(chan *stomp.Frame, 1)
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return nil, l.lostErr()
	}
	l.receipts[id] = ch
	l.mu.Unlock()
	forget := func() {
		l.mu.Lock()
		delete(l.receipts, id)
		l.mu.Unlock()
	}
	h := make([]stomp.Header, 0, len(headers)+1)
	h = append(append(h, headers...), stomp.Header{Name: "receipt", Value: id})
	if err := l.write(ctx, command, h, body); err != nil {
		forget()
		return nil, err
	}
	return func() (*stomp.Frame, error) {
		defer forget()
		select {
		case f := <-ch:
			return f, nil
		case <-l.done:
			select {
			case f := <-ch:
				return f, nil
			default:
			}
			return nil, l.lostErr()
		}
	}, nil
}

// request writes a frame with a receipt header and waits for the RECEIPT, the link's failure or ctx.
func (l *link) request(ctx context.Context, command string, headers []stomp.Header, body []byte) (*stomp.Frame, error) {
	id := l.c.id("r-")
	ch := make(chan *stomp.Frame, 1)
	l.mu.Lock()
	if l.err != nil {
		l.mu.Unlock()
		return nil, l.lostErr()
	}
	l.receipts[id] = ch
	l.mu.Unlock()
	defer func() {
		l.mu.Lock()
		delete(l.receipts, id)
		l.mu.Unlock()
	}()
	h := make([]stomp.Header, 0, len(headers)+1)
	h = append(append(h, headers...), stomp.Header{Name: "receipt", Value: id})
	if err := l.write(ctx, command, h, body); err != nil {
		return nil, err
	}
	select {
	case f := <-ch:
		return f, nil
	case <-l.done:
		select { // the RECEIPT may have come just before the broker closed the connection
		case f := <-ch:
			return f, nil
		default:
		}
		return nil, l.lostErr()
	case <-ctx.Done():
		return nil, fmt.Errorf("pymq: no RECEIPT for %s: %w", command, ctx.Err())
	}
}
