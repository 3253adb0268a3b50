// Command goload is bench_brokers.py's second load client (issue 30): the same workloads as
// bench/loadclient.py, driven through go-stomp (github.com/go-stomp/stomp/v3, a STOMP client nobody here
// wrote) so that no row of the broker benchmark depends on one client's behaviour.  go-stomp writes and
// flushes one frame per Send (no pipelining of 64 frames per write as loadclient.py does), waits for a
// receipt inside Send, and hands each MESSAGE to a channel: what a Go application using it would do.
//
// Protocol with its caller (bench/goload.py), one JSON line each way:
//
//	stdin  line 1: the spec (fields below)        stdout: {"ready": true} once every consumer is subscribed
//	stdin  line 2: "go" (the caller has sampled the broker's CPU)
//	stdout: the result (the fields of loadclient.RunResult), then the process exits
//
// The body layout and the application headers are loadclient.py's: producer id (4 digits), sequence (12),
// send time (20: nanoseconds of this process's monotonic clock, which producers and consumers share since
// they are goroutines of one process), padding; app-id, app-producer, app-seq, app-ts, app-attr-k.  Every
// consumer marks each (producer, sequence) it gets; a sequence nobody got is lost, one got twice (by one
// consumer, or by two consumers of a queue) is duplicated; on a topic every subscriber must get everything.
// A subscription is known to be in place when a later SEND with a receipt on the same connection (to a
// topic nobody subscribes to, so it leaves nothing behind) is confirmed: go-stomp cannot ask for a
// receipt on SUBSCRIBE, and a broker handles one connection's frames in order.
package main

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/go-stomp/stomp/v3"
	"github.com/go-stomp/stomp/v3/frame"
)

type spec struct {
	Host                  string  `json:"host"`
	Port                  int     `json:"port"`
	ConnectHost           string  `json:"connect_host"`
	Login                 string  `json:"login"`
	Passcode              string  `json:"passcode"`
	PrefetchHeader        string  `json:"prefetch_header"`
	ExplicitNonPersistent bool    `json:"explicit_non_persistent"`
	Destination           string  `json:"destination"`
	Topic                 bool    `json:"topic"`
	Producers             int     `json:"producers"`
	Consumers             int     `json:"consumers"`
	Size                  int     `json:"size"`
	Persistent            *bool   `json:"persistent"`
	AppHeaders            int     `json:"app_headers"`
	Count                 int     `json:"count"`
	Duration              float64 `json:"duration"`
	Rate                  float64 `json:"rate"`
	ReceiptEvery          int     `json:"receipt_every"`
	MaxUnconfirmed        int     `json:"max_unconfirmed"`
	Ack                   string  `json:"ack"`
	Prefetch              int     `json:"prefetch"`
	MaxInFlight           int     `json:"max_in_flight"`
	IdleTimeout           float64 `json:"idle_timeout"`
	Destinations          int     `json:"destinations"`
	// a file to write every delivery's (send, arrival) as two little-endian int64 of CLOCK_MONOTONIC
	// nanoseconds (bench/latency_trace.py's clock) when the run ends; "" (the bench) writes nothing
	SamplesPath string `json:"samples_path"`
	// pace with time.Sleep, the runtime's millisecond-stepped timer (goload before session 38: bursts of
	// 2-3 at 2,000 msg/s); latency_trace.py --steps --client go, to compare
	RuntimeSleep bool `json:"runtime_sleep"`
}

type result struct {
	Sent            int64    `json:"sent"`
	Received        int64    `json:"received"`
	Lost            int64    `json:"lost"`
	Duplicated      int64    `json:"duplicated"`
	Malformed       int64    `json:"malformed"`
	ElapsedS        float64  `json:"elapsed_s"`
	Rate            float64  `json:"rate"`
	SendRate        float64  `json:"send_rate"`
	LatP50          float64  `json:"lat_p50_us"`
	LatP99          float64  `json:"lat_p99_us"`
	LatP999         float64  `json:"lat_p999_us"`
	LatMax          float64  `json:"lat_max_us"`
	ClientCPUS      float64  `json:"client_cpu_s"`
	ClientCPUPct    float64  `json:"client_cpu_pct"`
	ConfirmWaitS    float64  `json:"confirm_wait_s"`
	ConsumersGaveUp string   `json:"consumers_gave_up"`
	Errors          []string `json:"errors"`
}

const headerLen = 36 // producer id (4) + sequence (12) + timestamp (20)

var base = time.Now()

func now() int64 { return int64(time.Since(base)) }

// monoAtBase: CLOCK_MONOTONIC at base (Go's monotonic readings are that clock on Linux), so a sample can be
// put beside another process's time.monotonic_ns(); read once, by the raw system call.
var monoAtBase = func() int64 {
	var ts syscall.Timespec
	t0 := now()
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1, uintptr(unsafe.Pointer(&ts)), 0) // CLOCK_MONOTONIC
	return ts.Nano() - t0
}()

func cpuSeconds() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	tv := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return tv(ru.Utime) + tv(ru.Stime)
}

func destinationOf(s *spec, index int) string {
	if s.Destinations <= 1 {
		return s.Destination
	}
	return fmt.Sprintf("%s.%d", s.Destination, index%s.Destinations)
}

func dial(s *spec) (*stomp.Conn, error) {
	addr := net.JoinHostPort(s.Host, strconv.Itoa(s.Port))
	return stomp.Dial("tcp", addr,
		stomp.ConnOpt.Login(s.Login, s.Passcode),
		stomp.ConnOpt.Host(s.ConnectHost),
		stomp.ConnOpt.AcceptVersion(stomp.V12),
		stomp.ConnOpt.HeartBeat(0, 0),
		stomp.ConnOpt.MsgSendTimeout(0),
		// go-stomp's connection loop both reads MESSAGEs into the subscription's channel and writes what
		// Send/Ack queued: with client acks, a full write queue and a full subscription channel wait on
		// each other (the consumer blocks in Ack).  Room for more than a prefetch of ACKs avoids that.
		stomp.ConnOpt.WriteChannelCapacity(4*s.Prefetch+1024),
		stomp.ConnOpt.RcvReceiptTimeout(120*time.Second))
}

// tally is one consumer's count and checks.
type tally struct {
	seen     [][]byte
	received atomic.Int64
	dups     int64
	bad      int64
	first    int64
	last     int64
	lat      []int64
	samples  []int64 // send, arrival pairs (only with spec.SamplesPath)
	err      error
}

type run struct {
	s         *spec
	sent      []atomic.Int64 // per producer: messages handed to go-stomp
	tallies   []*tally
	producing sync.WaitGroup
	errMu     sync.Mutex
	errs      []string
}

func (r *run) fail(format string, args ...any) {
	r.errMu.Lock()
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
	r.errMu.Unlock()
}

// delivered: what the producers' window compares with (the slowest subscriber of a topic).
func (r *run) delivered() int64 {
	if r.s.Topic {
		low := int64(math.MaxInt64)
		for _, t := range r.tallies {
			if v := t.received.Load(); v < low {
				low = v
			}
		}
		return low
	}
	var sum int64
	for _, t := range r.tallies {
		sum += t.received.Load()
	}
	return sum
}

func (r *run) totalSent() int64 {
	var sum int64
	for i := range r.sent {
		sum += r.sent[i].Load()
	}
	return sum
}

type producerOut struct {
	first, last, confirmed int64
	confirmWait            time.Duration
}

func (r *run) produce(pid int, conn *stomp.Conn, start int64, out *producerOut) {
	defer r.producing.Done()
	s := r.s
	pad := make([]byte, s.Size-headerLen)
	for i := range pad {
		pad[i] = 'x'
	}
	dest := destinationOf(s, pid)
	var opts []func(*frame.Frame) error
	if s.Persistent != nil && (*s.Persistent || s.ExplicitNonPersistent) {
		opts = append(opts, stomp.SendOpt.Header("persistent", strconv.FormatBool(*s.Persistent)))
	}
	appID := fmt.Sprintf("%08x-4b1d-4c3e-8f00-", pid)
	deadline := start + int64(s.Duration*1e9)
	var interval float64
	if s.Rate > 0 {
		interval = 1e9 / s.Rate
	}
	window := int64(s.MaxInFlight * s.Producers)
	// A careful producer (receipts): at most MaxUnconfirmed messages unconfirmed.  go-stomp waits for a
	// receipt inside Send, so each receipt-carrying SEND runs in a goroutine of its own, at most
	// MaxUnconfirmed/ReceiptEvery at once; the frames before it were already handed to the connection.
	slots := 1
	if s.ReceiptEvery > 0 && s.MaxUnconfirmed > 0 {
		slots = s.MaxUnconfirmed / s.ReceiptEvery
		if slots < 1 {
			slots = 1
		}
	}
	pending := make(chan chan error, slots)
	var waited time.Duration
	awaitOne := func() {
		t := time.Now()
		if err := <-<-pending; err != nil {
			r.fail("producer %d: receipt: %v", pid, err)
		}
		waited += time.Since(t)
	}
	paceStart := now()
	seq := 0
	for seq < s.Count {
		t := now()
		if t >= deadline {
			break
		}
		if interval > 0 {
			due := paceStart + int64(float64(seq)*interval)
			if due > t {
				if s.RuntimeSleep {
					time.Sleep(time.Duration(due - t))
				} else {
					sleepFor(due - t)
				}
				continue
			}
		}
		if window > 0 && r.totalSent()-r.delivered() > window {
			time.Sleep(time.Millisecond)
			continue
		}
		if out.first == 0 {
			out.first = t
		}
		ts := now()
		body := make([]byte, 0, s.Size)
		body = fmt.Appendf(body, "%04d%012d%020d", pid, seq, ts)
		body = append(body, pad...)
		msgOpts := opts
		if s.AppHeaders > 0 {
			msgOpts = append(append([]func(*frame.Frame) error{}, opts...), appHeaders(s.AppHeaders, appID, pid, seq)...)
		}
		receipt := s.ReceiptEvery > 0 && ((seq+1)%s.ReceiptEvery == 0 || seq+1 == s.Count)
		seq++
		r.sent[pid].Store(int64(seq))
		out.last = ts
		if receipt {
			if len(pending) == cap(pending) {
				awaitOne()
			}
			done := make(chan error, 1)
			pending <- done
			withReceipt := append(append([]func(*frame.Frame) error{}, msgOpts...), stomp.SendOpt.Receipt)
			go func() { done <- conn.Send(dest, "", body, withReceipt...) }()
			continue
		}
		if err := conn.Send(dest, "", body, msgOpts...); err != nil {
			r.fail("producer %d: send: %v", pid, err)
			return
		}
	}
	if s.ReceiptEvery > 0 && seq > 0 && seq%s.ReceiptEvery != 0 && seq != s.Count {
		// stopped by the deadline mid-stride: one more message carries the last receipt
		ts := now()
		body := fmt.Appendf(make([]byte, 0, s.Size), "%04d%012d%020d", pid, seq, ts)
		body = append(body, pad...)
		if s.AppHeaders > 0 {
			opts = append(opts, appHeaders(s.AppHeaders, appID, pid, seq)...)
		}
		seq++
		r.sent[pid].Store(int64(seq))
		out.last = ts
		t := time.Now()
		if err := conn.Send(dest, "", body, append(opts, stomp.SendOpt.Receipt)...); err != nil {
			r.fail("producer %d: last receipt: %v", pid, err)
		}
		waited += time.Since(t)
	}
	for len(pending) > 0 {
		awaitOne()
	}
	out.confirmed = now()
	out.confirmWait = waited
	// DISCONNECT with a receipt: the broker took every earlier SEND
	if err := conn.Disconnect(); err != nil {
		r.fail("producer %d: disconnect: %v", pid, err)
	}
}

// sleepFor blocks this goroutine's thread in nanosleep(2): the kernel's high-resolution timer, as the
// asyncio load client's time.sleep.  time.Sleep is the runtime's timer, which an otherwise idle Go process
// waits for in epoll_pwait with a whole-millisecond timeout: below 1 ms it slept 1.1-1.4 ms, so a 2,000
// msg/s producer sent its messages in bursts of 2-3 every ~1.2 ms (half the gaps under 100 µs), not one
// every 500 µs.  A signal (the runtime's preemption) ends it early: the caller checks the time again.
func sleepFor(ns int64) {
	ts := syscall.NsecToTimespec(ns)
	_ = syscall.Nanosleep(&ts, nil)
}

func appHeaders(n int, appID string, pid, seq int) []func(*frame.Frame) error {
	h := []func(*frame.Frame) error{
		stomp.SendOpt.Header("app-id", fmt.Sprintf("%s%012x", appID, seq)),
		stomp.SendOpt.Header("app-producer", strconv.Itoa(pid)),
		stomp.SendOpt.Header("app-seq", strconv.Itoa(seq)),
		stomp.SendOpt.Header("app-ts", strconv.FormatInt(time.Now().UnixMilli(), 10)),
	}
	if n < 4 {
		h = h[:n]
	}
	for k := 4; k < n; k++ {
		v := fmt.Sprintf("v%d", k)
		for len(v) < 16 {
			v += "a"
		}
		h = append(h, stomp.SendOpt.Header(fmt.Sprintf("app-attr-%d", k), v))
	}
	return h
}

func (r *run) consume(t *tally, sub *stomp.Subscription, conn *stomp.Conn, individual, checkApp bool) {
	keep := r.s.SamplesPath != ""
	for msg := range sub.C {
		if msg.Err != nil {
			t.err = msg.Err
			return
		}
		at := now()
		b := msg.Body
		ok := len(b) >= headerLen
		var pid, seq, ts int64
		if ok {
			var e1, e2, e3 error
			pid, e1 = strconv.ParseInt(string(b[0:4]), 10, 64)
			seq, e2 = strconv.ParseInt(string(b[4:16]), 10, 64)
			ts, e3 = strconv.ParseInt(string(b[16:36]), 10, 64)
			ok = e1 == nil && e2 == nil && e3 == nil && pid >= 0 && int(pid) < len(t.seen) &&
				seq >= 0 && int(seq) < len(t.seen[pid])
		}
		if ok && checkApp && msg.Header.Get("app-seq") != strconv.FormatInt(seq, 10) {
			ok = false
		}
		if individual {
			if err := conn.Ack(msg); err != nil {
				t.err = err
				return
			}
		}
		if !ok {
			t.bad++
			continue
		}
		if t.seen[pid][seq] != 0 {
			t.dups++
		} else {
			t.seen[pid][seq] = 1
		}
		if t.first == 0 {
			t.first = at
		}
		t.last = at
		if len(t.lat) < 2_000_000 {
			t.lat = append(t.lat, at-ts)
			if keep {
				t.samples = append(t.samples, ts+monoAtBase, at+monoAtBase)
			}
		}
		t.received.Add(1)
	}
}

func percentile(sorted []int64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Round(q * float64(len(sorted)-1)))
	return float64(sorted[i]) / 1000.0
}

func main() {
	in := bufio.NewReader(os.Stdin)
	line, err := in.ReadBytes('\n')
	if err != nil && !errors.Is(err, os.ErrClosed) && len(line) == 0 {
		fmt.Fprintln(os.Stderr, "goload: no spec on stdin:", err)
		os.Exit(2)
	}
	var s spec
	if err := json.Unmarshal(line, &s); err != nil {
		fmt.Fprintln(os.Stderr, "goload: bad spec:", err)
		os.Exit(2)
	}
	if s.Size < headerLen {
		fmt.Fprintf(os.Stderr, "goload: message size %d < %d bytes of bench header\n", s.Size, headerLen)
		os.Exit(2)
	}
	out := json.NewEncoder(os.Stdout)
	res := result{Errors: []string{}}
	r := &run{s: &s, sent: make([]atomic.Int64, s.Producers)}
	ackMode := stomp.AckAuto
	if s.Ack == "client-individual" {
		ackMode = stomp.AckClientIndividual
	}
	var consumerConns []*stomp.Conn
	var subs []*stomp.Subscription
	for c := 0; c < s.Consumers; c++ {
		conn, err := dial(&s)
		if err != nil {
			fatal(out, &res, "consumer %d: connect: %v", c, err)
		}
		consumerConns = append(consumerConns, conn)
		t := &tally{seen: make([][]byte, s.Producers)}
		for p := range t.seen {
			t.seen[p] = make([]byte, s.Count+1)
		}
		r.tallies = append(r.tallies, t)
		opts := []func(*frame.Frame) error{stomp.SubscribeOpt.Id(strconv.Itoa(c))}
		if s.PrefetchHeader != "" {
			opts = append(opts, stomp.SubscribeOpt.Header(s.PrefetchHeader, strconv.Itoa(s.Prefetch)))
		}
		sub, err := conn.Subscribe(destinationOf(&s, c), ackMode, opts...)
		if err != nil {
			fatal(out, &res, "consumer %d: subscribe: %v", c, err)
		}
		subs = append(subs, sub)
		// the SUBSCRIBE is in place once a later frame's receipt comes back (see the package comment)
		if err := conn.Send(fmt.Sprintf("/topic/goload.probe.%d", os.Getpid()), "", []byte("probe"),
			stomp.SendOpt.Receipt); err != nil {
			fatal(out, &res, "consumer %d: subscription not confirmed: %v", c, err)
		}
	}
	producerConns := make([]*stomp.Conn, s.Producers)
	for p := range producerConns {
		if producerConns[p], err = dial(&s); err != nil {
			fatal(out, &res, "producer %d: connect: %v", p, err)
		}
	}
	_ = out.Encode(map[string]bool{"ready": true})
	if goLine, _ := in.ReadString('\n'); goLine != "go\n" {
		os.Exit(0) // the caller gave up
	}
	cpu0 := cpuSeconds()
	var consuming sync.WaitGroup
	for c, sub := range subs {
		consuming.Add(1)
		go func(c int, sub *stomp.Subscription) {
			defer consuming.Done()
			r.consume(r.tallies[c], sub, consumerConns[c], ackMode == stomp.AckClientIndividual, s.AppHeaders >= 3)
		}(c, sub)
	}
	start := now() + 20_000_000
	for now() < start {
		time.Sleep(time.Millisecond)
	}
	outs := make([]producerOut, s.Producers)
	for p, conn := range producerConns {
		r.producing.Add(1)
		go r.produce(p, conn, start, &outs[p])
	}
	r.producing.Wait()
	sent := r.totalSent()
	// consumers stop once they have everything, or IdleTimeout after their last progress, or at a hard deadline
	lastProgress, lastTotal := time.Now(), int64(-1)
	hard := time.Now().Add(time.Duration((s.IdleTimeout + 60) * 1e9))
	for {
		got := r.delivered()
		want := sent
		if got >= want {
			break
		}
		var total int64
		for _, t := range r.tallies {
			total += t.received.Load()
		}
		if total != lastTotal {
			lastTotal, lastProgress = total, time.Now()
		}
		stop := ""
		for c, t := range r.tallies {
			if t.err != nil {
				stop = fmt.Sprintf("consumer %d: %v", c, t.err)
			}
		}
		if stop != "" {
			r.fail("%s", stop)
			break
		}
		if time.Since(lastProgress) > time.Duration(s.IdleTimeout*1e9) {
			res.ConsumersGaveUp = fmt.Sprintf("no delivery for %.0f s after the producers finished", s.IdleTimeout)
			break
		}
		if time.Now().After(hard) {
			res.ConsumersGaveUp = "hard deadline"
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // a late duplicate
	res.ClientCPUS = cpuSeconds() - cpu0
	for _, conn := range consumerConns {
		_ = conn.Disconnect()
	}
	consuming.Wait()
	// loss and duplicates, per producer sequence space (each consumer alone on a topic; all together on a queue)
	res.Sent = sent
	var lat []int64
	var first, last int64
	for _, t := range r.tallies {
		res.Received += t.received.Load()
		res.Duplicated += t.dups
		res.Malformed += t.bad
		lat = append(lat, t.lat...)
		if t.last > last {
			last = t.last
		}
	}
	groups := [][]*tally{r.tallies}
	if s.Topic {
		groups = nil
		for _, t := range r.tallies {
			groups = append(groups, []*tally{t})
		}
	}
	for _, g := range groups {
		for p := 0; p < s.Producers; p++ {
			n := int(r.sent[p].Load())
			for q := 0; q < n && q < s.Count+1; q++ {
				seen := 0
				for _, t := range g {
					seen += int(t.seen[p][q])
				}
				if seen == 0 {
					res.Lost++
				} else if seen > 1 {
					res.Duplicated += int64(seen - 1)
				}
			}
		}
	}
	var confirmed int64
	for _, o := range outs {
		if o.first != 0 && (first == 0 || o.first < first) {
			first = o.first
		}
		if o.confirmed > confirmed {
			confirmed = o.confirmed
		}
		if w := o.confirmWait.Seconds(); w > res.ConfirmWaitS {
			res.ConfirmWaitS = w
		}
	}
	if first != 0 && last > first {
		res.ElapsedS = float64(last-first) / 1e9
		res.Rate = float64(res.Received) / res.ElapsedS
		res.ClientCPUPct = 100 * res.ClientCPUS / res.ElapsedS
	}
	if first != 0 && confirmed > first {
		res.SendRate = float64(sent) / (float64(confirmed-first) / 1e9)
	}
	if s.SamplesPath != "" {
		if err := writeSamples(s.SamplesPath, r.tallies); err != nil {
			res.Errors = append(res.Errors, fmt.Sprintf("samples: %v", err))
		}
	}
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	res.LatP50, res.LatP99, res.LatP999 = percentile(lat, 0.5), percentile(lat, 0.99), percentile(lat, 0.999)
	if len(lat) > 0 {
		res.LatMax = float64(lat[len(lat)-1]) / 1000
	}
	res.Errors = append(res.Errors, r.errs...)
	_ = out.Encode(res)
}

func fatal(out *json.Encoder, res *result, format string, args ...any) {
	res.Errors = append(res.Errors, fmt.Sprintf(format, args...))
	_ = out.Encode(res)
	os.Exit(1)
}

func writeSamples(path string, tallies []*tally) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, t := range tallies {
		if err := binary.Write(w, binary.LittleEndian, t.samples); err != nil {
			f.Close()
			return err
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
