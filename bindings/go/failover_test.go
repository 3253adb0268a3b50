package pymq_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	pymq "github.com/pymq/pymq/bindings/go"
	"github.com/pymq/pymq/bindings/go/internal/vectors"
	"github.com/pymq/pymq/bindings/go/stomp"
)

// TestFailoverURLVectors: spec/vectors/failover_urls.json (spec/ha.md §4.1-4.2): every URL parsed or
// refused with its kind, and the waits before each attempt.
func TestFailoverURLVectors(t *testing.T) {
	var v struct {
		Parse []struct {
			Name, URL string
			Failover  bool
			Brokers   []struct {
				Host               string
				Port               int
				TLS                bool
				Username, Password *string
			}
			Options map[string]any
		}
		Refuse []struct{ Name, URL, Error string }
		VHosts []struct {
			Name, URL string
			VHost     *string
			Members   []struct {
				Host  string
				Port  int
				VHost *string
			}
		} `json:"vhosts"`
		Delays []struct {
			Name, URL string
			DelaysMs  []float64 `json:"delays_ms"`
		}
	}
	if err := vectors.Load("failover_urls.json", &v); err != nil {
		t.Fatal(err)
	}
	for _, c := range v.VHosts {
		g, err := pymq.ParseBrokerURL(c.URL)
		if err != nil || len(g.Brokers) != len(c.Members) {
			t.Errorf("%s: %v %v", c.Name, g, err)
			continue
		}
		opts := pymq.Options{}
		if c.VHost != nil {
			opts.VHost = *c.VHost
		}
		for i, w := range c.Members {
			b, want := g.Brokers[i], ""
			if w.VHost != nil {
				want = *w.VHost
			}
			if got := opts.VHostAt(b); b.Host != w.Host || b.Port != w.Port || got != want {
				t.Errorf("%s: member %d = %s:%d vhost %q, want %s:%d %q", c.Name, i, b.Host, b.Port, got, w.Host, w.Port, want)
			}
		}
	}
	for _, c := range v.Parse {
		g, err := pymq.ParseBrokerURL(c.URL)
		if err != nil {
			t.Errorf("%s: %v", c.Name, err)
			continue
		}
		if g.Failover != c.Failover || len(g.Brokers) != len(c.Brokers) {
			t.Errorf("%s: failover=%v brokers=%v", c.Name, g.Failover, g.Brokers)
			continue
		}
		for i, w := range c.Brokers {
			b := g.Brokers[i]
			user, pass := (*string)(nil), (*string)(nil)
			if b.HasUser {
				user = &b.Username
			}
			if b.HasPass {
				pass = &b.Password
			}
			if b.Host != w.Host || b.Port != w.Port || b.TLS != w.TLS || !sameStr(user, w.Username) || !sameStr(pass, w.Password) {
				t.Errorf("%s: broker %d = %+v, want %+v", c.Name, i, b, w)
			}
		}
		o := g.Options
		got := map[string]any{"initialReconnectDelay": float64(o.InitialReconnectDelay),
			"maxReconnectDelay": float64(o.MaxReconnectDelay), "useExponentialBackOff": o.UseExponentialBackOff,
			"backOffMultiplier": o.BackOffMultiplier, "jitter": o.Jitter,
			"maxReconnectAttempts": float64(o.MaxReconnectAttempts), "startupMaxReconnectAttempts": float64(o.StartupMaxReconnectAttempts),
			"randomize": o.Randomize, "timeout": float64(o.Timeout), "connectionTimeout": float64(o.ConnectionTimeout)}
		for k, want := range c.Options {
			if _, known := got[k]; !known || got[k] != want {
				t.Errorf("%s: option %s = %v, want %v", c.Name, k, got[k], want)
			}
		}
	}
	for _, c := range v.Refuse {
		_, err := pymq.ParseBrokerURL(c.URL)
		var ue *pymq.URLError
		if !errors.As(err, &ue) || ue.Kind != c.Error {
			t.Errorf("refuse %s (%q): got %v, want kind %s", c.Name, c.URL, err, c.Error)
		} else if strings.Contains(err.Error(), "s3cret") {
			t.Errorf("refuse %s: the message shows a password: %v", c.Name, err)
		}
	}
	for _, c := range v.Delays {
		g, err := pymq.ParseBrokerURL(c.URL)
		if err != nil {
			t.Fatal(err)
		}
		for i, want := range c.DelaysMs {
			got := float64(g.Options.DelayBefore(i+1)) / float64(time.Millisecond)
			if math.Abs(got-want) > 1e-6 {
				t.Errorf("%s: attempt %d waits %v ms, want %v", c.Name, i+1, got, want)
			}
		}
	}
}

func sameStr(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

// kill9 ends a's process with SIGKILL: it closes nothing.
func kill9(a *testBroker) {
	a.mu.Lock()
	cmd, waited := a.cmd, a.waited
	a.cmd = nil
	a.mu.Unlock()
	_ = cmd.Process.Kill()
	<-waited
}

func freePort(t *testing.T) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// haPair starts a live/backup pair of real pymq-server processes over one shared data directory
// (spec/ha.md §1: the file store's OS lock and lease): a is live, b waits as its backup and will listen
// at portB once it takes over.
func haPair(t *testing.T) (a, b *testBroker, portB string) {
	t.Helper()
	cfg := writeConfig(t, "ha:\n  lease_ms: 1000\n  poll_ms: 50\nheartbeat_send_ms: 500\nheartbeat_recv_ms: 500\n")
	a = ownBroker(t, cfg...)
	if a.addr == "" { // every member first says it waits as a backup, then takes the free store
		a.awaitLive(t, 60*time.Second)
	}
	portB = freePort(t)
	b = &testBroker{command: a.command, dataDir: a.dataDir, extra: cfg, others: map[string]string{},
		changed: make(chan struct{}, 1)}
	if err := b.start(portB); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.stop)
	if b.addr != "" {
		t.Fatalf("the second member of the pair is live (%s), not a backup", b.addr)
	}
	return a, b, portB
}

// flowRecord is what a client-acknowledging consumer saw of one message.
type flowRecord struct {
	text        string
	redelivered bool
}

// TestFailoverFollowsATakeover: the live of a real live/backup pair (spec/ha.md) is killed with SIGKILL
// under a producer that waits for its receipts and a client-acknowledging consumer; the backup takes over
// the store at another port, and a connection whose URL names both carries on: OnStatus says
// reconnecting then open, a send made meanwhile goes through, every receipted message is delivered (a
// second copy only flagged redelivered), subscriptions are made again (a durable one with its selector,
// a shared durable one and a shared one by their names), the message held unacknowledged comes back
// redelivered, and the transaction that had sent something fails at Commit with ErrTxLost while the next
// one commits.
func TestFailoverFollowsATakeover(t *testing.T) {
	a, b, portB := haPair(t)
	log := newStatusLog()
	url := "failover:(stomp://" + a.addr + ",stomp://127.0.0.1:" + portB + ")?initialReconnectDelay=50&maxReconnectDelay=400"
	c, err := pymq.Dial(url, pymq.Options{ClientID: "go-ha-" + strconv.FormatInt(time.Now().UnixNano(), 36), OnStatus: log.record})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	held := queue(t)
	flow := queue(t)
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	topic := "/topic/go-ha-" + tag
	sHeld := subscribe(t, c, held, pymq.SubscribeOptions{Ack: pymq.AckClientIndividual})
	sDur := subscribe(t, c, topic, pymq.SubscribeOptions{DurableName: "d", Selector: "n > 0"})
	sSharedDur := subscribe(t, c, topic, pymq.SubscribeOptions{DurableName: "sd-" + tag,
		Headers: []stomp.Header{{Name: "shared", Value: "true"}}})
	sShared := subscribe(t, c, topic, pymq.SubscribeOptions{
		Headers: []stomp.Header{{Name: "shared-subscription-name", Value: "s-" + tag}}})
	sFlow := subscribe(t, c, flow, pymq.SubscribeOptions{Ack: pymq.AckClient, Prefetch: 20})
	send(t, c, held, pymq.NewTextMessage("held"))
	first := expect(t, sHeld)
	txDest := queue(t)
	tx, err := c.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx.Send(bg, txDest, pymq.NewTextMessage("lost with the transaction")); err != nil {
		t.Fatal(err)
	}

	// a producer waiting for each receipt, and a consumer acknowledging each message, while the live dies
	var mu sync.Mutex
	var receipted []string
	var seen []flowRecord
	stopFlow := make(chan struct{})
	produced := make(chan error, 1)
	go func() {
		for i := 0; ; i++ {
			select {
			case <-stopFlow:
				produced <- nil
				return
			default:
			}
			text := "flow-" + strconv.Itoa(i)
			ctx, cancel := context.WithTimeout(bg, 60*time.Second)
			err := c.Send(ctx, flow, pymq.NewTextMessage(text))
			cancel()
			if err != nil {
				produced <- err
				return
			}
			mu.Lock()
			receipted = append(receipted, text)
			mu.Unlock()
		}
	}()
	consumed := make(chan struct{})
	go func() {
		defer close(consumed)
		for {
			ctx, cancel := context.WithTimeout(bg, 3*time.Second)
			m, err := sFlow.Receive(ctx)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				select {
				case <-stopFlow:
					return // quiet for 3 s after the producer stopped: all there is
				default:
					continue
				}
			}
			if err != nil {
				return
			}
			mu.Lock()
			seen = append(seen, flowRecord{m.Text(), m.Redelivered})
			mu.Unlock()
			_ = m.Ack(bg) // ErrStaleMessage for a delivery of the lost link: it comes again
		}
	}()
	countReceipted := func() int { mu.Lock(); defer mu.Unlock(); return len(receipted) }
	for deadline := time.Now().Add(20 * time.Second); countReceipted() < 20; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the producer made no progress before the kill")
		}
	}

	kill9(a)
	log.await(t, pymq.StatusReconnecting, 1, 20*time.Second)
	done := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg, 60*time.Second)
		defer cancel()
		done <- c.Send(ctx, held, pymq.NewTextMessage("during"))
	}()
	b.awaitLive(t, 60*time.Second)
	if err := <-done; err != nil {
		t.Fatalf("the send made during the outage: %v", err)
	}
	log.await(t, pymq.StatusOpen, 2, 30*time.Second)
	atKill := countReceipted()
	for deadline := time.Now().Add(20 * time.Second); countReceipted() < atKill+20; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the producer made no progress after the takeover")
		}
	}
	close(stopFlow)
	if err := <-produced; err != nil {
		t.Fatalf("a send across the takeover failed: %v", err)
	}
	<-consumed
	mu.Lock()
	got := map[string]int{}
	for _, r := range seen {
		got[r.text]++
		if got[r.text] > 1 && !r.redelivered {
			t.Errorf("%s came again unflagged", r.text)
		}
	}
	for _, text := range receipted {
		if got[text] == 0 {
			t.Errorf("the receipted %s was lost", text)
		}
	}
	t.Logf("%d receipted sends, %d deliveries (%d before the kill)", len(receipted), len(seen), atKill)
	mu.Unlock()

	if err := first.Ack(bg); !errors.Is(err, pymq.ErrStaleMessage) {
		t.Fatalf("acking a message of the lost link: want ErrStaleMessage, got %v", err)
	}
	again := expect(t, sHeld)
	if again.Text() != "held" || !again.Redelivered {
		t.Fatalf("want held redelivered, got %q redelivered=%v", again.Text(), again.Redelivered)
	}
	if err := again.Ack(bg); err != nil {
		t.Fatal(err)
	}
	if during := expect(t, sHeld); during.Text() != "during" {
		t.Fatalf("want the message sent during the outage, got %q", during.Text())
	}
	if err := tx.Send(bg, txDest, pymq.NewTextMessage("after the loss")); err != nil {
		t.Fatalf("sends in a lost transaction go on: %v", err)
	}
	if err := tx.Commit(bg); !errors.Is(err, pymq.ErrTxLost) {
		t.Fatalf("commit of a transaction lost with its link: want ErrTxLost, got %v", err)
	}
	tx2, err := c.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	if err := tx2.Send(bg, txDest, pymq.NewTextMessage("committed")); err != nil {
		t.Fatal(err)
	}
	if err := tx2.Commit(bg); err != nil {
		t.Fatal(err)
	}
	sTx := subscribe(t, c, txDest, pymq.SubscribeOptions{})
	if got := expect(t, sTx); got.Text() != "committed" {
		t.Fatalf("the transaction's queue holds %q first", got.Text())
	}
	if extra := receive(t, sTx, 500*time.Millisecond); extra != nil {
		t.Fatalf("the rolled-back transaction delivered %q", extra.Text())
	}
	for _, n := range []int{0, 1} {
		m := pymq.NewTextMessage("n=" + strconv.Itoa(n))
		_ = m.SetProperty("n", n)
		send(t, c, topic, m)
	}
	if got := expect(t, sDur); got.Text() != "n=1" {
		t.Fatalf("the durable subscription with its selector: got %q", got.Text())
	}
	if extra := receive(t, sDur, 500*time.Millisecond); extra != nil {
		t.Fatalf("the selector let %q through", extra.Text())
	}
	for name, s := range map[string]*pymq.Subscription{"shared durable": sSharedDur, "shared": sShared} {
		for _, want := range []string{"n=0", "n=1"} {
			if got := expect(t, s); got.Text() != want {
				t.Fatalf("the %s subscription after the takeover: got %q, want %q", name, got.Text(), want)
			}
		}
	}
}

// receiptDropper forwards a connection to the broker but drops the broker's RECEIPT frames on the first
// connection, until cut: the broker has the SENDs, the client never hears so.
type receiptDropper struct {
	addr  string
	mu    sync.Mutex
	n     int
	conns []net.Conn
}

func newReceiptDropper(t *testing.T, broker string) *receiptDropper {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p := &receiptDropper{addr: ln.Addr().String()}
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			upstream, err := net.Dial("tcp", broker)
			if err != nil {
				client.Close()
				continue
			}
			p.mu.Lock()
			p.n++
			first := p.n == 1
			p.conns = append(p.conns, client, upstream)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(upstream, client); upstream.Close() }()
			go func() {
				defer client.Close()
				if !first {
					_, _ = io.Copy(client, upstream)
					return
				}
				buf := make([]byte, 64<<10)
				var pending []byte
				for {
					n, err := upstream.Read(buf)
					pending = append(pending, buf[:n]...)
					var out []byte
					for {
						i := bytes.IndexByte(pending, 0)
						if i < 0 {
							break
						}
						frame := pending[:i+1]
						pending = pending[i+1:]
						if !bytes.HasPrefix(bytes.TrimLeft(frame, "\r\n"), []byte("RECEIPT\n")) {
							out = append(out, frame...)
						}
					}
					if len(out) > 0 {
						if _, err := client.Write(out); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return p
}

func (p *receiptDropper) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestUnreceiptedSendsGoAgainOnce: SENDs the broker took but whose receipts were lost go again after the
// reconnect with their dedup ids, and the broker keeps one copy of each.
func TestUnreceiptedSendsGoAgainOnce(t *testing.T) {
	proxy := newReceiptDropper(t, needBroker(t))
	log := newStatusLog()
	c, err := pymq.Dial("failover:(stomp://"+proxy.addr+")?initialReconnectDelay=20", pymq.Options{OnStatus: log.record})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dest := queue(t)
	persistent := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(bg, 30*time.Second)
		defer cancel()
		persistent <- c.Send(ctx, dest, pymq.NewTextMessage("persistent"))
	}()
	for i := 1; i <= 3; i++ {
		m := pymq.NewTextMessage("quick-" + strconv.Itoa(i))
		m.NonPersistent = true
		if err := c.Send(bg, dest, m); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case err := <-persistent:
		t.Fatalf("a persistent send returned without its receipt: %v", err)
	case <-time.After(300 * time.Millisecond): // the broker has them all; only the receipts are missing
	}
	proxy.cut()
	if err := <-persistent; err != nil {
		t.Fatalf("the persistent send after the reconnect: %v", err)
	}
	got := drain(t, dest)
	sort.Strings(got)
	if strings.Join(got, ",") != "persistent,quick-1,quick-2,quick-3" {
		t.Fatalf("every SEND once (re-sent with its dedup id, the copy dropped): got %v", got)
	}
}

// TestFailoverGivesUpAfterItsAttempts: with maxReconnectAttempts the connection ends (Err, Done) once they
// are spent, and calls fail.
func TestFailoverGivesUpAfterItsAttempts(t *testing.T) {
	proxy := newCutProxy(t, needBroker(t))
	c, err := pymq.Dial("failover:(stomp://"+proxy.addr+",stomp://127.0.0.1:"+freePort(t)+")?initialReconnectDelay=10&maxReconnectAttempts=3", pymq.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	proxy.stop()
	select {
	case <-c.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the connection never gave up")
	}
	if err := c.Err(); !errors.Is(err, pymq.ErrDisconnected) || !strings.Contains(err.Error(), "3 attempts") {
		t.Fatalf("Err: %v", err)
	}
	if err := c.Send(bg, queue(t), pymq.NewTextMessage("x")); err == nil {
		t.Fatal("a send of an ended connection must fail")
	}
}

// halfOpenProxy forwards connections to the broker; cutClientOnly ends one for its client only, leaving the
// broker's side open and silent, as a network partition does (the broker notices at its heart-beat deadline).
type halfOpenProxy struct {
	addr     string
	mu       sync.Mutex
	n        int
	pairs    map[int][2]net.Conn
	halfOpen map[int]bool
}

func newHalfOpenProxy(t *testing.T, broker string) *halfOpenProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &halfOpenProxy{addr: ln.Addr().String(), pairs: map[int][2]net.Conn{}, halfOpen: map[int]bool{}}
	t.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		defer p.mu.Unlock()
		for _, c := range p.pairs {
			c[0].Close()
			c[1].Close()
		}
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			upstream, err := net.Dial("tcp", broker)
			if err != nil {
				client.Close()
				continue
			}
			p.mu.Lock()
			p.n++
			n := p.n
			p.pairs[n] = [2]net.Conn{client, upstream}
			p.mu.Unlock()
			go func() {
				_, _ = io.Copy(upstream, client)
				p.mu.Lock()
				half := p.halfOpen[n]
				p.mu.Unlock()
				if !half {
					upstream.Close()
				}
			}()
			go func() { _, _ = io.Copy(client, upstream); client.Close() }()
		}
	}()
	return p
}

func (p *halfOpenProxy) connections() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.n
}

func (p *halfOpenProxy) cutClientOnly(n int) {
	p.mu.Lock()
	p.halfOpen[n] = true
	c := p.pairs[n][0]
	p.mu.Unlock()
	c.Close()
}

func (p *halfOpenProxy) endHalfOpen() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for n := range p.halfOpen {
		p.pairs[n][1].Close()
	}
}

// TestAClientIDTheBrokerStillHoldsIsWaitedFor: after a loss the broker may still hold the connection's
// client id for the old link it has not seen die; that refusal passes, so reconnection goes on (it used to
// end the connection for good) and succeeds once the broker lets the id go.
// dialHalfOpen connects with a client id, through a half-open proxy, and subscribes to a new queue.
func dialHalfOpen(t *testing.T, idPrefix string) (*halfOpenProxy, *pymq.Conn, *statusLog, string, *pymq.Subscription) {
	t.Helper()
	p := newHalfOpenProxy(t, needBroker(t))
	log := newStatusLog()
	c, err := pymq.Dial("failover:(stomp://"+p.addr+")?initialReconnectDelay=20&maxReconnectDelay=100",
		pymq.Options{ClientID: idPrefix + strconv.FormatInt(time.Now().UnixNano(), 36), OnStatus: log.record})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	dest := queue(t)
	return p, c, log, dest, subscribe(t, c, dest, pymq.SubscribeOptions{})
}

func TestAClientIDTheBrokerStillHoldsIsWaitedFor(t *testing.T) {
	p, c, log, dest, s := dialHalfOpen(t, "go-held-")
	// without a re-claim token (a broker with temporary_reclaim_ms: 0): a re-claim would end the half-open
	// link at once (TestAReclaimEndsAHalfOpenLinkAtOnce)
	pymq.EditReclaimToken(c, func(string) string { return "" })
	p.cutClientOnly(1)
	deadline := time.Now().Add(20 * time.Second)
	for p.connections() < 4 && c.Err() == nil {
		if time.Now().After(deadline) {
			t.Fatalf("no reconnection attempts: %d connections", p.connections())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("a client id the broker still holds ended the connection: %v", err)
	}
	p.endHalfOpen()
	log.await(t, pymq.StatusOpen, 2, 20*time.Second)
	send(t, c, dest, pymq.NewTextMessage("back"))
	if got := expect(t, s); got.Text() != "back" {
		t.Fatalf("got %q", got.Text())
	}
}

// TestAReclaimEndsAHalfOpenLinkAtOnce (spec/ha.md §4.7 rule 2): the reconnection offers the lost link's
// re-claim token, so the broker closes the half-open old link, which still holds the client id, at once:
// the first attempt succeeds (no illegal-state refusals) and the temporary names are kept.
func TestAReclaimEndsAHalfOpenLinkAtOnce(t *testing.T) {
	p, c, log, dest, s := dialHalfOpen(t, "go-reclaim-")
	p.cutClientOnly(1)
	log.await(t, pymq.StatusOpen, 2, 20*time.Second)
	if n := p.connections(); n != 2 {
		t.Fatalf("%d connections: the reconnection was refused while the old link was half-open", n)
	}
	if errs := log.errorsWith(pymq.StatusOpen); errs[1] != nil {
		t.Fatalf("the temporary names were not kept: %v", errs[1])
	}
	send(t, c, dest, pymq.NewTextMessage("back"))
	if got := expect(t, s); got.Text() != "back" {
		t.Fatalf("got %q", got.Text())
	}
}

// silentServer accepts TCP connections and never answers (a SIGSTOPped broker's port does the same: the
// kernel completes the handshake); accepted counts them.
func silentServer(t *testing.T) (addr string, accepted func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var held []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range held {
			c.Close()
		}
		mu.Unlock()
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			held = append(held, c)
			mu.Unlock()
		}
	}()
	return ln.Addr().String(), func() int { mu.Lock(); defer mu.Unlock(); return len(held) }
}

// TestASilentBrokerIsPassedOverWithinConnectionTimeout: connectionTimeout (spec/ha.md §4.2) bounds each
// attempt, so a broker whose port accepts and never answers is passed over for the next one, at the first
// connect and after a loss, long before the connection's own Timeout (40 s here: without the option the
// first Dial fails once it is spent, and the send after the loss outlives the failover timeout of 20 s).
func TestASilentBrokerIsPassedOverWithinConnectionTimeout(t *testing.T) {
	silent, accepted := silentServer(t)
	broker := needBroker(t)
	const options = "?connectionTimeout=2000&initialReconnectDelay=20&maxReconnectDelay=200&timeout=20000"
	c, err := pymq.Dial("failover:(stomp://"+silent+",stomp://"+broker+")"+options,
		pymq.Options{Timeout: 40 * time.Second})
	if err != nil {
		t.Fatalf("the broker after a silent one was not reached: %v", err)
	}
	c.Close()
	if accepted() != 1 {
		t.Fatalf("the silent broker was tried %d times, want once (first in the list)", accepted())
	}
	// after a loss the attempts start with the broker after the lost one: the silent one
	proxy := newCutProxy(t, broker)
	log := newStatusLog()
	c, err = pymq.Dial("failover:(stomp://"+proxy.addr+",stomp://"+silent+",stomp://"+broker+")"+options,
		pymq.Options{Timeout: 40 * time.Second, OnStatus: log.record})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dest := queue(t)
	s := subscribe(t, c, dest, pymq.SubscribeOptions{})
	proxy.stop()
	log.await(t, pymq.StatusReconnecting, 1, 20*time.Second)
	ctx, cancel := context.WithTimeout(bg, 60*time.Second)
	defer cancel()
	if err := c.Send(ctx, dest, pymq.NewTextMessage("after")); err != nil {
		t.Fatalf("a send after the loss: %v", err)
	}
	if accepted() != 2 {
		t.Fatalf("the silent broker was tried %d times in all, want twice", accepted())
	}
	if got := expect(t, s); got.Text() != "after" {
		t.Fatalf("got %q", got.Text())
	}
}
