package pymq_test

import (
	"archive/zip"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	pymq "github.com/pymq/pymq/bindings/go"
)

// statusLog collects the statuses a Conn reports, for waiting on them.
type statusLog struct {
	mu     sync.Mutex
	seen   []pymq.Status
	errs   []error // beside each status, the error OnStatus got
	notify chan struct{}
}

func newStatusLog() *statusLog { return &statusLog{notify: make(chan struct{}, 100)} }

func (s *statusLog) record(st pymq.Status, err error) {
	s.mu.Lock()
	s.seen = append(s.seen, st)
	s.errs = append(s.errs, err)
	s.mu.Unlock()
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// await waits until the n-th report of want (1-based) arrives.
func (s *statusLog) await(t *testing.T, want pymq.Status, n int, within time.Duration) {
	t.Helper()
	deadline := time.After(within)
	for {
		s.mu.Lock()
		count := 0
		for _, st := range s.seen {
			if st == want {
				count++
			}
		}
		seen := append([]pymq.Status(nil), s.seen...)
		s.mu.Unlock()
		if count >= n {
			return
		}
		select {
		case <-s.notify:
		case <-deadline:
			t.Fatalf("status %v #%d never came; saw %v", want, n, seen)
		}
	}
}

// TestReconnectAfterBrokerRestart: the broker stops and starts again on the same port over the same data
// directory; the client reconnects with backoff, subscribes again, and the broker redelivers the message
// that was delivered but not acknowledged.  Calls made during the outage wait within their context.
func TestReconnectAfterBrokerRestart(t *testing.T) {
	b := ownBroker(t)
	log := newStatusLog()
	c, err := pymq.Dial(b.addr, pymq.Options{ClientID: "go-reconnect", OnStatus: log.record,
		Reconnect: &pymq.Reconnect{InitialDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dest := queue(t)
	topic := strings.Replace(dest, "/queue/", "/topic/", 1)
	q := subscribe(t, c, dest, pymq.SubscribeOptions{Ack: pymq.AckClientIndividual})
	durable := subscribe(t, c, topic, pymq.SubscribeOptions{DurableName: "audit"})
	send(t, c, dest, pymq.NewTextMessage("unacked"))
	first := expect(t, q)

	b.stop()
	log.await(t, pymq.StatusReconnecting, 1, 10*time.Second)
	ctx, cancel := context.WithTimeout(bg, 200*time.Millisecond)
	err = c.Send(ctx, dest, pymq.NewTextMessage("during the outage"))
	cancel()
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a send while the broker is away waits within its context; got %v", err)
	}
	if err := b.start(strings.Split(b.addr, ":")[1]); err != nil {
		t.Fatal(err)
	}
	log.await(t, pymq.StatusOpen, 2, 20*time.Second)
	if st := c.Stats(); st.Reconnects != 1 || c.Status() != pymq.StatusOpen {
		t.Fatalf("stats %+v status %v", st, c.Status())
	}

	if err := first.Ack(bg); !errors.Is(err, pymq.ErrStaleMessage) {
		t.Fatalf("acking a message of the old connection: want ErrStaleMessage, got %v", err)
	}
	// a persistent message survives the restart and comes back (a restarted broker does not know it had
	// been delivered, so it is not marked redelivered: TestReconnectAfterTheConnectionIsCut checks that)
	again := expect(t, q)
	if again.Text() != "unacked" {
		t.Fatalf("the unacknowledged message comes back: %q", again.Text())
	}
	if err := again.Ack(bg); err != nil {
		t.Fatal(err)
	}
	send(t, c, dest, pymq.NewTextMessage("after"))
	if m := expect(t, q); m.Text() != "after" {
		t.Fatalf("got %q", m.Text())
	}
	other, err := pymq.Dial(b.addr, pymq.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()
	send(t, other, topic, pymq.NewTextMessage("to the durable subscription"))
	if m := expect(t, durable); m.Text() != "to the durable subscription" {
		t.Fatalf("got %q", m.Text())
	}
	if err := durable.Unsubscribe(bg); err != nil {
		t.Fatal(err)
	}
}

// cutProxy forwards to the broker and cuts every live connection on demand (new ones are let through).
type cutProxy struct {
	addr  string
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
}

func newCutProxy(t *testing.T, broker string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	p := &cutProxy{addr: ln.Addr().String(), ln: ln}
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
			p.conns = append(p.conns, client, upstream)
			p.mu.Unlock()
			go func() { _, _ = io.Copy(upstream, client); upstream.Close() }()
			go func() { _, _ = io.Copy(client, upstream); client.Close() }()
		}
	}()
	return p
}

// stop: nobody answers at the proxy's address any more, and its connections are cut.
func (p *cutProxy) stop() {
	p.ln.Close()
	p.cut()
}

func (p *cutProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

// TestReconnectAfterTheConnectionIsCut: the broker stays up and sees the connection end, so it returns
// the unacknowledged message marked redelivered with its delivery count up; the client reconnects and
// gets it on the subscription it made again.
func TestReconnectAfterTheConnectionIsCut(t *testing.T) {
	proxy := newCutProxy(t, needBroker(t))
	log := newStatusLog()
	c, err := pymq.Dial(proxy.addr, pymq.Options{OnStatus: log.record,
		Reconnect: &pymq.Reconnect{InitialDelay: 20 * time.Millisecond, MaxDelay: 200 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	dest := queue(t)
	s := subscribe(t, c, dest, pymq.SubscribeOptions{Ack: pymq.AckClientIndividual})
	send(t, c, dest, pymq.NewTextMessage("in hand"))
	first := expect(t, s)
	proxy.cut()
	log.await(t, pymq.StatusOpen, 2, 20*time.Second)
	if err := first.Nack(bg); !errors.Is(err, pymq.ErrStaleMessage) {
		t.Fatalf("want ErrStaleMessage, got %v", err)
	}
	again := expect(t, s)
	if again.Text() != "in hand" || !again.Redelivered || again.DeliveryCount != 2 {
		t.Fatalf("redelivery: %q redelivered=%v count=%d", again.Text(), again.Redelivered, again.DeliveryCount)
	}
	if err := again.Ack(bg); err != nil {
		t.Fatal(err)
	}
}

// TestTransactionsDoNotSurviveAReconnect: the broker aborts a transaction whose connection ended; one that
// had sent something can only fail at Commit (ErrTxLost), and what it sent never arrives.
func TestTransactionsDoNotSurviveAReconnect(t *testing.T) {
	b := ownBroker(t)
	log := newStatusLog()
	c, err := pymq.Dial(b.addr, pymq.Options{OnStatus: log.record,
		Reconnect: &pymq.Reconnect{InitialDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	tx, err := c.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	dest := queue(t)
	if err := tx.Send(bg, dest, pymq.NewTextMessage("before")); err != nil {
		t.Fatal(err)
	}
	if err := b.restart(); err != nil {
		t.Fatal(err)
	}
	log.await(t, pymq.StatusOpen, 2, 20*time.Second)
	if err := tx.Send(bg, dest, pymq.NewTextMessage("after")); err != nil {
		t.Fatalf("a lost transaction goes on until its commit: %v", err)
	}
	if err := tx.Commit(bg); !errors.Is(err, pymq.ErrTxLost) {
		t.Fatalf("want ErrTxLost, got %v", err)
	}
	if got := drain(t, dest); len(got) != 0 {
		t.Fatalf("a rolled-back transaction delivered %v", got)
	}
}

// TestWithoutReconnectALostBrokerIsFinal: the error says the connection was lost, and later calls fail.
func TestWithoutReconnectALostBrokerIsFinal(t *testing.T) {
	b := ownBroker(t)
	c, err := pymq.Dial(b.addr, pymq.Options{})
	if err != nil {
		t.Fatal(err)
	}
	b.stop()
	select {
	case <-c.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the connection did not notice the broker stopped")
	}
	if !errors.Is(c.Err(), pymq.ErrDisconnected) || c.Status() != pymq.StatusClosed {
		t.Fatalf("err %v status %v", c.Err(), c.Status())
	}
	if err := c.Send(bg, "/queue/x", pymq.NewTextMessage("x")); !errors.Is(err, pymq.ErrDisconnected) {
		t.Fatalf("got %v", err)
	}
}

// TestHeartBeatsBothWaysWithTheBroker: a broker configured for 500 ms heart-beats honours the client's own
// intervals between heartbeat_min_ms (250 ms) and 500 ms (spec/stomp.md section 6), each side takes the
// larger of each pair, both sides beat while idle, and the idle connection stays up.
func TestHeartBeatsBothWaysWithTheBroker(t *testing.T) {
	b := ownBroker(t, writeConfig(t, "heartbeat_send_ms: 500\nheartbeat_recv_ms: 500\n")...)
	for _, ask := range []struct{ send, receive, wantSend, wantReceive time.Duration }{
		{100, 100, 250, 250},     // no faster than heartbeat_min_ms
		{2000, 2000, 2000, 2000}, // the broker offers 500; the larger of each pair is the client's
	} {
		o, err := pymq.Dial(b.addr, pymq.Options{HeartBeat: &pymq.HeartBeat{Send: ask.send * time.Millisecond, Receive: ask.receive * time.Millisecond}})
		if err != nil {
			t.Fatal(err)
		}
		if s, r := o.HeartBeats(); s != ask.wantSend*time.Millisecond || r != ask.wantReceive*time.Millisecond {
			t.Fatalf("asked %d,%d ms: negotiated send %v receive %v, want %d and %d ms", ask.send, ask.receive, s, r, ask.wantSend, ask.wantReceive)
		}
		o.Close()
	}
	c, err := pymq.Dial(b.addr, pymq.Options{HeartBeat: &pymq.HeartBeat{Send: 400 * time.Millisecond, Receive: 450 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send, receive := c.HeartBeats()
	if send != 400*time.Millisecond || receive != 450*time.Millisecond {
		t.Fatalf("negotiated send %v receive %v, want the client's own 400 and 450 ms", send, receive)
	}
	deadline := time.Now().Add(20 * time.Second)
	for c.Stats().HeartBeatsSent < 3 || c.Stats().HeartBeatsReceived < 3 {
		if time.Now().After(deadline) {
			t.Fatalf("heart-beats: %+v", c.Stats())
		}
		time.Sleep(50 * time.Millisecond)
	}
	if c.Err() != nil {
		t.Fatalf("an idle connection with heart-beats must stay up: %v", c.Err())
	}
	dest := queue(t)
	send2(t, c, dest)
	off := dial(t, pymq.Options{HeartBeat: &pymq.HeartBeat{}})
	if s, r := off.HeartBeats(); s != 0 || r != 0 {
		t.Fatalf("heart-beats off on this side: %v %v", s, r)
	}
}

func send2(t *testing.T, c *pymq.Conn, dest string) {
	t.Helper()
	s := subscribe(t, c, dest, pymq.SubscribeOptions{})
	send(t, c, dest, pymq.NewTextMessage("still up"))
	if m := expect(t, s); m.Text() != "still up" {
		t.Fatalf("got %q", m.Text())
	}
}

// fakeServer accepts one connection, answers CONNECT with connected (if not empty), then runs then.
func fakeServer(t *testing.T, connected string, then func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		buf := make([]byte, 1)
		for { // read up to the CONNECT frame's NUL
			if _, err := nc.Read(buf); err != nil || buf[0] == 0 {
				break
			}
		}
		if connected != "" {
			_, _ = nc.Write([]byte(connected))
		}
		then(nc)
	}()
	return ln.Addr().String()
}

// TestASilentBrokerIsDeclaredDead: after CONNECTED with heart-beat 100,100 the server says nothing more;
// the client gives up on it after twice the interval, and has sent beats meanwhile.
func TestASilentBrokerIsDeclaredDead(t *testing.T) {
	beats := make(chan int, 1)
	addr := fakeServer(t, "CONNECTED\nversion:1.2\nheart-beat:100,100\n\n\x00", func(nc net.Conn) {
		n := 0
		buf := make([]byte, 64)
		for {
			k, err := nc.Read(buf)
			for _, b := range buf[:k] {
				if b == '\n' {
					n++
				}
			}
			if err != nil {
				beats <- n
				return
			}
		}
	})
	c, err := pymq.Dial(addr, pymq.Options{HeartBeat: &pymq.HeartBeat{Send: 100 * time.Millisecond, Receive: 100 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	select {
	case <-c.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("a silent broker was not declared dead")
	}
	if !errors.Is(c.Err(), pymq.ErrHeartBeat) || !errors.Is(c.Err(), pymq.ErrDisconnected) {
		t.Fatalf("want ErrHeartBeat, got %v", c.Err())
	}
	if n := <-beats; n < 1 {
		t.Fatalf("the client sent %d heart-beats while idle", n)
	}
}

// TestContextCancelsAHandshakeWithASilentServer: a server that never answers CONNECT.
func TestContextCancelsAHandshakeWithASilentServer(t *testing.T) {
	hold := make(chan struct{})
	t.Cleanup(func() { close(hold) })
	addr := fakeServer(t, "", func(net.Conn) { <-hold })
	ctx, cancel := context.WithTimeout(bg, 300*time.Millisecond)
	defer cancel()
	_, err := pymq.DialContext(ctx, addr, pymq.Options{})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("want the context's deadline, got %v", err)
	}
	ctx2, cancel2 := context.WithCancel(bg)
	go func() { time.Sleep(100 * time.Millisecond); cancel2() }()
	if _, err := pymq.DialContext(ctx2, fakeServer(t, "", func(net.Conn) { <-hold }), pymq.Options{}); !errors.Is(err, context.Canceled) {
		t.Fatalf("want cancellation, got %v", err)
	}
}

// TestConnectOverYourOwnConn: the handshake over a net.Conn the application made.
func TestConnectOverYourOwnConn(t *testing.T) {
	addr := needBroker(t)
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pymq.Connect(bg, nc, pymq.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send2(t, c, queue(t))
	nc2, _ := net.Dial("tcp", addr)
	if _, err := pymq.Connect(bg, nc2, pymq.Options{Reconnect: &pymq.Reconnect{}}); err == nil ||
		!strings.Contains(err.Error(), "Dial") {
		t.Fatalf("reconnecting a connection made elsewhere needs Reconnect.Dial: %v", err)
	}
	redials := 0
	nc3, _ := net.Dial("tcp", addr)
	c3, err := pymq.Connect(bg, nc3, pymq.Options{Reconnect: &pymq.Reconnect{InitialDelay: 10 * time.Millisecond,
		Dial: func(ctx context.Context) (net.Conn, error) {
			redials++
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}}})
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	nc3.Close() // cut under the client: it redials with the function it was given
	deadline := time.Now().Add(20 * time.Second)
	for c3.Stats().Reconnects < 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no reconnect; status %v err %v", c3.Status(), c3.Err())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if redials < 1 {
		t.Fatal("Reconnect.Dial was not used")
	}
	send2(t, c3, queue(t))
}

// TestChannelAPI: messages through Subscription.C in a select; auto acknowledgement on hand-over; the
// channel closes when the subscription ends.
func TestChannelAPI(t *testing.T) {
	c := dial(t, pymq.Options{})
	dest := queue(t)
	s := subscribe(t, c, dest, pymq.SubscribeOptions{})
	for _, text := range []string{"c1", "c2", "c3"} {
		send(t, c, dest, pymq.NewTextMessage(text))
	}
	var got []string
	timeout := time.After(10 * time.Second)
	for len(got) < 3 {
		select {
		case m := <-s.C():
			got = append(got, m.Text())
		case <-timeout:
			t.Fatalf("got %v", got)
		}
	}
	if strings.Join(got, ",") != "c1,c2,c3" {
		t.Fatalf("got %v", got)
	}
	if err := s.Unsubscribe(bg); err != nil {
		t.Fatal(err)
	}
	select {
	case _, open := <-s.C():
		if open {
			t.Fatal("a message after unsubscribing")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the channel did not close")
	}
	other := dial(t, pymq.Options{})
	if m := receive(t, subscribe(t, other, dest, pymq.SubscribeOptions{}), 500*time.Millisecond); m != nil {
		t.Fatalf("messages handed over through the channel are acknowledged; left %q", m.Text())
	}
}

// testCertificates makes a CA and a certificate for 127.0.0.1 and localhost signed by it.
func testCertificates(t *testing.T) (leafDER []byte, key *ecdsa.PrivateKey, caCert *x509.Certificate) {
	t.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	ca := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "pymq test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, _ = x509.ParseCertificate(caDER)
	key, _ = ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	leaf := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	leafDER, err = x509.CreateCertificate(rand.Reader, leaf, caCert, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return leafDER, key, caCert
}

// tlsProxy terminates TLS with a certificate signed by a CA made here, and forwards to the broker.
func tlsProxy(t *testing.T, broker string) (addr string, roots *x509.CertPool) {
	t.Helper()
	leafDER, key, caCert := testCertificates(t)
	cfg := &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{leafDER}, PrivateKey: key}}}
	ln, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer client.Close()
				upstream, err := net.Dial("tcp", broker)
				if err != nil {
					return
				}
				defer upstream.Close()
				go func() { _, _ = io.Copy(upstream, client); upstream.Close() }()
				_, _ = io.Copy(client, upstream)
			}()
		}
	}()
	roots = x509.NewCertPool()
	roots.AddCert(caCert)
	return ln.Addr().String(), roots
}

// TestTLSThroughATerminatingProxy: stomp+ssl:// with the test CA works; an unknown CA and plain STOMP to a
// TLS port do not.
func TestTLSThroughATerminatingProxy(t *testing.T) {
	addr, roots := tlsProxy(t, needBroker(t))
	c, err := pymq.Dial("stomp+ssl://"+addr, pymq.Options{TLS: &tls.Config{RootCAs: roots}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send2(t, c, queue(t))
	if _, err := pymq.Dial("stomp+ssl://"+addr, pymq.Options{TLS: &tls.Config{RootCAs: x509.NewCertPool()}}); err == nil ||
		!strings.Contains(err.Error(), "certificate") {
		t.Fatalf("an unknown CA must be refused: %v", err)
	}
	if _, err := pymq.Dial(addr, pymq.Options{Timeout: 2 * time.Second}); err == nil {
		t.Fatal("plain STOMP to a TLS port must fail")
	}
	wrongName, err := pymq.Dial("stomp+ssl://"+addr, pymq.Options{TLS: &tls.Config{RootCAs: roots, ServerName: "elsewhere.example"}})
	if err == nil {
		wrongName.Close()
		t.Fatal("a certificate for another name must be refused")
	}
}

// TestTheModulePathResolves: a module outside this repository requires github.com/pymq/pymq/bindings/go
// through a module proxy (a file:// one made here from this directory, as proxy.golang.org would serve
// the repository's bindings/go/vX.Y.Z tag) and builds against it.
func TestTheModulePathResolves(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a module")
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go command on PATH")
	}
	const module, version = "github.com/pymq/pymq/bindings/go", "v0.1.0"
	proxy := t.TempDir()
	dir := filepath.Join(proxy, filepath.FromSlash(module), "@v")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	gomod, err := os.ReadFile("go.mod")
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		if err != nil {
			t.Helper()
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "list"), []byte(version+"\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, version+".info"), []byte(`{"Version":"`+version+`","Time":"2026-01-01T00:00:00Z"}`), 0o644))
	must(os.WriteFile(filepath.Join(dir, version+".mod"), gomod, 0o644))
	zf, err := os.Create(filepath.Join(dir, version+".zip"))
	must(err)
	zw := zip.NewWriter(zf)
	must(filepath.Walk(".", func(path string, info os.FileInfo, err error) error {
		if err != nil || info.IsDir() {
			return err
		}
		w, err := zw.Create(module + "@" + version + "/" + filepath.ToSlash(path))
		if err != nil {
			return err
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		_, err = w.Write(data)
		return err
	}))
	must(zw.Close())
	must(zf.Close())
	app := t.TempDir()
	must(os.WriteFile(filepath.Join(app, "go.mod"), []byte("module example.com/app\n\ngo 1.19\n"), 0o644))
	must(os.WriteFile(filepath.Join(app, "main.go"), []byte(`package main

import (
	pymq "github.com/pymq/pymq/bindings/go"
	"github.com/pymq/pymq/bindings/go/routing"
)

func main() {
	_ = pymq.NewTextMessage("hello")
	println(routing.GroupHash("customer-42"))
}
`), 0o644))
	env := append(os.Environ(), "GOPROXY=file://"+filepath.ToSlash(proxy), "GOSUMDB=off", "GOFLAGS=-mod=mod",
		"GONOSUMDB=github.com/pymq", "GOPRIVATE=", "GOWORK=off", "GOPATH="+t.TempDir(), "GOMODCACHE="+t.TempDir())
	for _, args := range [][]string{{"get", module + "@" + version}, {"build", "./..."}} {
		cmd := exec.Command(goBin, args...)
		cmd.Dir, cmd.Env = app, env
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go %v: %v\n%s", args, err, out)
		}
	}
}

// deadlineConn records a deadline moved into the past after the handshake cleared it.
type deadlineConn struct {
	net.Conn
	mu       sync.Mutex
	cleared  bool
	cutAfter bool
}

func (d *deadlineConn) SetDeadline(t time.Time) error {
	d.mu.Lock()
	if t.IsZero() {
		d.cleared = true
	} else if d.cleared && t.Before(time.Now()) {
		d.cutAfter = true
	}
	d.mu.Unlock()
	return d.Conn.SetDeadline(t)
}

// TestAContextCancelledAfterConnectDoesNotCutTheConnection: the handshake's watcher must not move the
// deadline of a finished handshake (it did when the caller cancelled its context right after Connect:
// under load the link then died with an i/o timeout).  Twenty tries make a 50 % race show.
func TestAContextCancelledAfterConnectDoesNotCutTheConnection(t *testing.T) {
	addr := needBroker(t)
	for i := 0; i < 20; i++ {
		nc, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		dc := &deadlineConn{Conn: nc}
		ctx, cancel := context.WithCancel(bg)
		c, err := pymq.Connect(ctx, dc, pymq.Options{})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond)
		dc.mu.Lock()
		cut := dc.cutAfter
		dc.mu.Unlock()
		c.Close()
		if cut {
			t.Fatalf("try %d: the deadline of an established connection was moved into the past", i)
		}
	}
}

// TestTLSToTheBrokersOwnPort: the broker serving stomp+ssl:// itself (its tls_port, with a certificate
// made here), as well as through the proxy above.
func TestTLSToTheBrokersOwnPort(t *testing.T) {
	leafDER, key, caCert := testCertificates(t)
	dir := t.TempDir()
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile := filepath.Join(dir, "broker.pem"), filepath.Join(dir, "broker.key")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: leafDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600); err != nil {
		t.Fatal(err)
	}
	// a fixed TLS port (one free now), so that the restarted broker listens where the client reconnects
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tlsPort := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	b := ownBroker(t, writeConfig(t, fmt.Sprintf("tls_port: %d\ntls:\n  cert_file: %s\n  key_file: %s\n",
		tlsPort, certFile, keyFile))...)
	addr := b.listener(t, "tls")
	roots := x509.NewCertPool()
	roots.AddCert(caCert)
	log := newStatusLog()
	c, err := pymq.Dial("stomp+ssl://"+addr, pymq.Options{TLS: &tls.Config{RootCAs: roots}, OnStatus: log.record,
		Reconnect: &pymq.Reconnect{InitialDelay: 50 * time.Millisecond, MaxDelay: 500 * time.Millisecond}})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	send2(t, c, queue(t))
	if _, err := pymq.Dial("stomp+ssl://"+addr, pymq.Options{TLS: &tls.Config{RootCAs: x509.NewCertPool()}}); err == nil {
		t.Fatal("an unknown CA must be refused")
	}
	// reconnection goes through the TLS handshake again
	if err := b.restart(); err != nil {
		t.Fatal(err)
	}
	log.await(t, pymq.StatusOpen, 2, 20*time.Second)
	send2(t, c, queue(t))
}

// errorsWith are the errors OnStatus got with status st, in order (nil included).
func (s *statusLog) errorsWith(st pymq.Status) []error {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []error
	for i, got := range s.seen {
		if got == st {
			out = append(out, s.errs[i])
		}
	}
	return out
}
