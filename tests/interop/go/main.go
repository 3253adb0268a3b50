// Command stomp-driver puts go-stomp (github.com/go-stomp/stomp/v3, a STOMP client nobody here wrote)
// under the control of pymq's interoperability tests.
//
// It reads one JSON request per line on stdin and writes exactly one JSON reply per line on stdout, in
// order; the protocol (ops and fields) is documented in tests/interop/foreign.py, which is its only
// caller, and the Node driver next door speaks the same one.  Everything the driver does goes through
// go-stomp's public API, so what the broker sees is what a Go application would send; where go-stomp
// cannot express a request (a receipt on SUBSCRIBE, a chosen transaction id) the driver says so in a
// comment rather than writing frames itself.  go-stomp's own log goes to stderr; stdout carries replies only.
package main

import (
	"bufio"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/go-stomp/stomp/v3"
	"github.com/go-stomp/stomp/v3/frame"
)

type request struct {
	Op           string            `json:"op"`
	Host         string            `json:"host"`
	Port         int               `json:"port"`
	Version      string            `json:"version"`
	Login        string            `json:"login"`
	Passcode     string            `json:"passcode"`
	Headers      map[string]string `json:"headers"`
	Destination  string            `json:"destination"`
	BodyHex      string            `json:"body_hex"`
	ContentType  string            `json:"content_type"`
	Receipt      bool              `json:"receipt"`
	Transaction  string            `json:"transaction"`
	ID           string            `json:"id"`
	Ack          string            `json:"ack"`
	Subscription string            `json:"subscription"`
	MessageID    string            `json:"message_id"`
	TimeoutMs    int               `json:"timeout_ms"`
}

type wireMessage struct {
	Headers [][2]string `json:"headers"`
	BodyHex string      `json:"body_hex"`
}

type failure struct {
	Message string      `json:"message"`
	Headers [][2]string `json:"headers,omitempty"`
	BodyHex string      `json:"body_hex,omitempty"`
}

type reply map[string]any

// driver owns one go-stomp connection and everything the tests refer to by name.
type driver struct {
	conn          *stomp.Conn
	subscriptions map[string]*stomp.Subscription
	inboxes       map[string]chan *stomp.Message
	received      map[string]*stomp.Message // by message-id, for ACK/NACK
	transactions  map[string]*stomp.Transaction

	mu       sync.Mutex
	errs     []failure // ERROR frames and connection failures, first first
	errAdded chan struct{}
}

func newDriver() *driver {
	return &driver{
		subscriptions: map[string]*stomp.Subscription{},
		inboxes:       map[string]chan *stomp.Message{},
		received:      map[string]*stomp.Message{},
		transactions:  map[string]*stomp.Transaction{},
		errAdded:      make(chan struct{}, 1),
	}
}

func headerPairs(h *frame.Header) [][2]string {
	if h == nil {
		return nil
	}
	out := make([][2]string, 0, h.Len())
	for i := 0; i < h.Len(); i++ {
		k, v := h.GetAt(i)
		out = append(out, [2]string{k, v})
	}
	return out
}

// describe turns a go-stomp error into the reply's error fields, keeping the ERROR frame when there is one.
func describe(err error) failure {
	var se stomp.Error
	if errors.As(err, &se) {
		f := failure{Message: se.Message}
		if se.Frame != nil {
			f.Headers = headerPairs(se.Frame.Header)
			f.BodyHex = hex.EncodeToString(se.Frame.Body)
		}
		return f
	}
	var sp *stomp.Error
	if errors.As(err, &sp) && sp != nil {
		return describe(*sp)
	}
	return failure{Message: err.Error()}
}

func (d *driver) recordError(f failure) {
	d.mu.Lock()
	d.errs = append(d.errs, f)
	d.mu.Unlock()
	select {
	case d.errAdded <- struct{}{}:
	default:
	}
}

func (d *driver) fail(err error) reply {
	f := describe(err)
	if f.Headers != nil { // an ERROR frame from the broker: the connection is over, remember why
		d.recordError(f)
	}
	return reply{"ok": false, "error": f.Message, "frame": f}
}

func timeout(ms int) time.Duration {
	if ms <= 0 {
		ms = 5000
	}
	return time.Duration(ms) * time.Millisecond
}

func (d *driver) connect(r request) reply {
	host := r.Host
	if host == "" {
		host = "127.0.0.1"
	}
	// the CONNECT host header (a virtual host, spec/stomp.md §1): go-stomp's Host option, which a custom
	// header could not override
	vhost := "/"
	if v, ok := r.Headers["host"]; ok {
		vhost = v
		delete(r.Headers, "host")
	}
	opts := []func(*stomp.Conn) error{
		stomp.ConnOpt.Host(vhost),
		stomp.ConnOpt.HeartBeat(0, 0),
		stomp.ConnOpt.RcvReceiptTimeout(10 * time.Second),
		stomp.ConnOpt.DisconnectReceiptTimeout(10 * time.Second),
		stomp.ConnOpt.UnsubscribeReceiptTimeout(10 * time.Second),
	}
	if r.Login != "" {
		opts = append(opts, stomp.ConnOpt.Login(r.Login, r.Passcode))
	}
	if r.Version != "" {
		opts = append(opts, stomp.ConnOpt.AcceptVersion(stomp.Version(r.Version)))
	}
	for k, v := range r.Headers {
		opts = append(opts, stomp.ConnOpt.Header(k, v))
	}
	var connected [][2]string
	opts = append(opts, stomp.ConnOpt.ResponseHeaders(func(h *frame.Header) { connected = headerPairs(h) }))
	conn, err := stomp.Dial("tcp", host+":"+strconv.Itoa(r.Port), opts...)
	if err != nil {
		return d.fail(err)
	}
	d.conn = conn
	return reply{"ok": true, "version": string(conn.Version()), "headers": connected}
}

func (d *driver) transaction(name string) (*stomp.Transaction, error) {
	if name == "" {
		return nil, nil
	}
	tx, ok := d.transactions[name]
	if !ok {
		return nil, fmt.Errorf("driver: no transaction named %q (begin it first)", name)
	}
	return tx, nil
}

func (d *driver) send(r request) reply {
	body, err := hex.DecodeString(r.BodyHex)
	if err != nil {
		return reply{"ok": false, "error": "driver: body_hex: " + err.Error()}
	}
	var opts []func(*frame.Frame) error
	for k, v := range r.Headers {
		opts = append(opts, stomp.SendOpt.Header(k, v))
	}
	if r.Receipt {
		opts = append(opts, stomp.SendOpt.Receipt)
	}
	tx, err := d.transaction(r.Transaction)
	if err != nil {
		return reply{"ok": false, "error": err.Error()}
	}
	if tx != nil {
		err = tx.Send(r.Destination, r.ContentType, body, opts...)
	} else {
		err = d.conn.Send(r.Destination, r.ContentType, body, opts...)
	}
	if err != nil {
		return d.fail(err)
	}
	return reply{"ok": true, "receipted": r.Receipt}
}

func ackMode(name string) (stomp.AckMode, error) {
	switch name {
	case "", "auto":
		return stomp.AckAuto, nil
	case "client":
		return stomp.AckClient, nil
	case "client-individual":
		return stomp.AckClientIndividual, nil
	}
	return stomp.AckAuto, fmt.Errorf("driver: unknown ack mode %q", name)
}

// pump moves a subscription's messages into an unbounded-enough inbox, so a test that reads slowly never
// stalls go-stomp's single processing goroutine (its channel holds 16).
func (d *driver) pump(sub *stomp.Subscription, inbox chan *stomp.Message) {
	for msg := range sub.C {
		if msg.Err != nil {
			d.recordError(describe(msg.Err))
			continue
		}
		inbox <- msg
	}
}

func (d *driver) subscribe(r request) reply {
	mode, err := ackMode(r.Ack)
	if err != nil {
		return reply{"ok": false, "error": err.Error()}
	}
	// go-stomp cannot wait for a RECEIPT on SUBSCRIBE (it files the receipt under the subscription's own
	// channel); tests that must know the subscription is live follow it with the "sync" op.
	opts := []func(*frame.Frame) error{stomp.SubscribeOpt.Id(r.ID)}
	for k, v := range r.Headers {
		opts = append(opts, stomp.SubscribeOpt.Header(k, v))
	}
	sub, err := d.conn.Subscribe(r.Destination, mode, opts...)
	if err != nil {
		return d.fail(err)
	}
	inbox := make(chan *stomp.Message, 100000)
	d.subscriptions[r.ID] = sub
	d.inboxes[r.ID] = inbox
	go d.pump(sub, inbox)
	return reply{"ok": true}
}

func (d *driver) receive(r request) reply {
	inbox, ok := d.inboxes[r.Subscription]
	if !ok {
		return reply{"ok": false, "error": fmt.Sprintf("driver: no subscription %q", r.Subscription)}
	}
	select {
	case msg := <-inbox:
		if id, ok := msg.Header.Contains(frame.MessageId); ok {
			d.received[id] = msg
		}
		return reply{"ok": true, "message": wireMessage{Headers: headerPairs(msg.Header),
			BodyHex: hex.EncodeToString(msg.Body)}}
	case <-time.After(timeout(r.TimeoutMs)):
		return reply{"ok": true, "message": nil}
	}
}

func (d *driver) acknowledge(r request, positive bool) reply {
	msg, ok := d.received[r.MessageID]
	if !ok {
		return reply{"ok": false, "error": fmt.Sprintf("driver: no received message %q", r.MessageID)}
	}
	tx, err := d.transaction(r.Transaction)
	if err != nil {
		return reply{"ok": false, "error": err.Error()}
	}
	switch {
	case tx != nil && positive:
		err = tx.Ack(msg)
	case tx != nil:
		err = tx.Nack(msg)
	case positive:
		err = d.conn.Ack(msg)
	default:
		err = d.conn.Nack(msg)
	}
	if err != nil {
		return d.fail(err)
	}
	return reply{"ok": true}
}

func (d *driver) begin(r request) reply {
	// go-stomp picks the transaction id itself; tests name transactions and the driver maps the names.
	tx, err := d.conn.BeginWithError()
	if err != nil {
		return d.fail(err)
	}
	d.transactions[r.Transaction] = tx
	return reply{"ok": true, "transaction_id": tx.Id()}
}

func (d *driver) finish(r request, commit bool) reply {
	tx, err := d.transaction(r.Transaction)
	if err == nil && tx == nil {
		err = errors.New("driver: commit/abort needs a transaction name")
	}
	if err != nil {
		return reply{"ok": false, "error": err.Error()}
	}
	switch {
	case commit && r.Receipt:
		err = tx.CommitWithReceipt()
	case commit:
		err = tx.Commit()
	case r.Receipt:
		err = tx.AbortWithReceipt()
	default:
		err = tx.Abort()
	}
	delete(d.transactions, r.Transaction)
	if err != nil {
		return d.fail(err)
	}
	return reply{"ok": true, "receipted": r.Receipt}
}

// sync is a barrier: BEGIN then ABORT with a receipt.  A RECEIPT confirms every earlier frame, so after
// it the broker has processed every SUBSCRIBE sent before.
func (d *driver) sync() reply {
	tx, err := d.conn.BeginWithError()
	if err == nil {
		err = tx.AbortWithReceipt()
	}
	if err != nil {
		return d.fail(err)
	}
	return reply{"ok": true}
}

func (d *driver) unsubscribe(r request) reply {
	sub, ok := d.subscriptions[r.ID]
	if !ok {
		return reply{"ok": false, "error": fmt.Sprintf("driver: no subscription %q", r.ID)}
	}
	var opts []func(*frame.Frame) error
	for k, v := range r.Headers {
		opts = append(opts, stomp.SubscribeOpt.Header(k, v))
	}
	// go-stomp always asks for a receipt here and waits for it
	if err := sub.Unsubscribe(opts...); err != nil {
		return d.fail(err)
	}
	delete(d.subscriptions, r.ID)
	return reply{"ok": true}
}

func (d *driver) waitError(r request) reply {
	deadline := time.After(timeout(r.TimeoutMs))
	for {
		d.mu.Lock()
		if len(d.errs) > 0 {
			f := d.errs[0]
			d.mu.Unlock()
			return reply{"ok": true, "error": f}
		}
		d.mu.Unlock()
		select {
		case <-d.errAdded:
		case <-deadline:
			return reply{"ok": true, "error": nil}
		}
	}
}

func (d *driver) handle(r request) reply {
	if d.conn == nil && r.Op != "connect" && r.Op != "error" && r.Op != "hello" {
		return reply{"ok": false, "error": "driver: connect first"}
	}
	switch r.Op {
	case "hello":
		return reply{"ok": true, "client": "go-stomp", "library": "github.com/go-stomp/stomp/v3",
			"error_frames": true}
	case "connect":
		return d.connect(r)
	case "send":
		return d.send(r)
	case "subscribe":
		return d.subscribe(r)
	case "receive":
		return d.receive(r)
	case "ack":
		return d.acknowledge(r, true)
	case "nack":
		return d.acknowledge(r, false)
	case "begin":
		return d.begin(r)
	case "commit":
		return d.finish(r, true)
	case "abort":
		return d.finish(r, false)
	case "sync":
		return d.sync()
	case "unsubscribe":
		return d.unsubscribe(r)
	case "error":
		return d.waitError(r)
	case "disconnect":
		if err := d.conn.Disconnect(); err != nil {
			return d.fail(err)
		}
		return reply{"ok": true}
	}
	return reply{"ok": false, "error": fmt.Sprintf("driver: unknown op %q", r.Op)}
}

func main() {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 256<<20)
	out := json.NewEncoder(os.Stdout)
	d := newDriver()
	for in.Scan() {
		var r request
		var rep reply
		if err := json.Unmarshal(in.Bytes(), &r); err != nil {
			rep = reply{"ok": false, "error": "driver: bad request: " + err.Error()}
		} else {
			rep = d.handle(r)
		}
		if err := out.Encode(rep); err != nil {
			fmt.Fprintln(os.Stderr, "stomp-driver: cannot write reply:", err)
			os.Exit(1)
		}
	}
}
