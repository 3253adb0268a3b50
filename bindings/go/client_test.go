package pymq_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"strings"
	"testing"
	"time"

	pymq "github.com/pymq/pymq/bindings/go"
)

var bg = context.Background()

func dial(t *testing.T, opts pymq.Options) *pymq.Conn {
	t.Helper()
	c, err := pymq.Dial(needBroker(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func queue(t *testing.T) string {
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	return "/queue/go-" + strings.ReplaceAll(t.Name(), "/", "-") + "-" + hex.EncodeToString(b)
}

func receive(t *testing.T, s *pymq.Subscription, wait time.Duration) *pymq.Message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	m, err := s.Receive(ctx)
	if errors.Is(err, context.DeadlineExceeded) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func expect(t *testing.T, s *pymq.Subscription) *pymq.Message {
	t.Helper()
	m := receive(t, s, 5*time.Second)
	if m == nil {
		t.Fatalf("nothing received on %s", s.Destination)
	}
	return m
}

func subscribe(t *testing.T, c *pymq.Conn, dest string, opts pymq.SubscribeOptions) *pymq.Subscription {
	t.Helper()
	s, err := c.Subscribe(context.Background(), dest, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func send(t *testing.T, c *pymq.Conn, dest string, m *pymq.Message) {
	t.Helper()
	if err := c.Send(context.Background(), dest, m); err != nil {
		t.Fatal(err)
	}
}

// drain returns the texts waiting on dest, read by a fresh connection.
func drain(t *testing.T, dest string) []string {
	t.Helper()
	c := dial(t, pymq.Options{})
	s := subscribe(t, c, dest, pymq.SubscribeOptions{})
	var out []string
	for wait := 5 * time.Second; ; wait = 500 * time.Millisecond {
		m := receive(t, s, wait)
		if m == nil {
			return out
		}
		out = append(out, m.Text())
	}
}

func TestConnectNegotiatesAndRefusesBadCredentials(t *testing.T) {
	c := dial(t, pymq.Options{})
	if c.Version() != "1.2" || c.Session() == "" {
		t.Fatalf("version %q session %q", c.Version(), c.Session())
	}
	old := dial(t, pymq.Options{Version: "1.1"})
	if old.Version() != "1.1" {
		t.Fatalf("asked for 1.1, got %s", old.Version())
	}
	_, err := pymq.Dial(needBroker(t), pymq.Options{Login: "guest", Passcode: "wrong"})
	var se *pymq.ServerError
	if !errors.As(err, &se) || se.Code != "authentication-failed" {
		t.Fatalf("want authentication-failed, got %v", err)
	}
}

func TestJMSHeadersAndTypedPropertiesCrossTheBroker(t *testing.T) {
	for _, version := range []string{"1.1", "1.2"} {
		t.Run(version, func(t *testing.T) {
			c := dial(t, pymq.Options{Version: version})
			dest := queue(t)
			m := pymq.NewTextMessage("héllo")
			m.CorrelationID = "corr:1\nx"
			m.ReplyTo = "/queue/replies"
			m.Type = "order"
			m.Priority = 7
			m.Expires = time.Now().Add(time.Hour).UnixMilli()
			m.SetGroupID("g-1")
			for name, value := range map[string]any{"count": 42, "ratio": 0.25, "whole": 3.0, "flag": true,
				"label": "a:b\\c", "JMSXGroupSeq": 1} {
				if err := m.SetProperty(name, value); err != nil {
					t.Fatal(err)
				}
			}
			send(t, c, dest, m)
			if !strings.HasPrefix(m.ID, "ID:") {
				t.Fatalf("a receipted send gets the broker's id, got %q", m.ID)
			}
			got := expect(t, subscribe(t, c, dest, pymq.SubscribeOptions{}))
			if got.Kind() != pymq.TextKind || got.Text() != "héllo" || got.ID != m.ID {
				t.Fatalf("got %v %q %q", got.Kind(), got.Text(), got.ID)
			}
			if got.CorrelationID != m.CorrelationID || got.ReplyTo != m.ReplyTo || got.Type != "order" ||
				got.Priority != 7 || got.Expires != m.Expires || got.NonPersistent || got.Timestamp != m.Timestamp {
				t.Fatalf("JMS headers changed: %+v", got)
			}
			if got.Destination != dest || got.GroupID() != "g-1" || got.DeliveryCount != 1 || got.Redelivered ||
				!got.HasSequence {
				t.Fatalf("broker fields: %+v", got)
			}
			want := map[string]any{"count": int64(42), "ratio": 0.25, "whole": 3.0, "flag": true,
				"label": "a:b\\c", "JMSXGroupSeq": int64(1), "JMSXGroupID": "g-1"}
			for k, v := range want {
				if got.Properties[k] != v {
					t.Errorf("property %s = %#v, want %#v", k, got.Properties[k], v)
				}
			}
		})
	}
}

func TestBytesMapAndNonPersistentMessages(t *testing.T) {
	c := dial(t, pymq.Options{})
	dest := queue(t)
	payload := make([]byte, 300_000)
	_, _ = rand.Read(payload)
	payload[0] = 0
	send(t, c, dest, pymq.NewBytesMessage(payload))
	mm, err := pymq.NewMapMessage(map[string]any{"sku": "A-1", "qty": 3, "blob": []byte{0, 1}})
	if err != nil {
		t.Fatal(err)
	}
	send(t, c, dest, mm)
	np := pymq.NewTextMessage("fleeting")
	np.NonPersistent = true
	send(t, c, dest, np)
	s := subscribe(t, c, dest, pymq.SubscribeOptions{})
	if b := expect(t, s); b.Kind() != pymq.BytesKind || !bytes.Equal(b.Body, payload) {
		t.Fatalf("bytes message changed (%v, %d bytes)", b.Kind(), len(b.Body))
	}
	got := expect(t, s)
	values, err := got.Map()
	if got.Kind() != pymq.MapKind || err != nil || values["sku"] != "A-1" || values["qty"] != int64(3) ||
		!bytes.Equal(values["blob"].([]byte), []byte{0, 1}) {
		t.Fatalf("map message: %v %v %v", got.Kind(), values, err)
	}
	if last := expect(t, s); last.Text() != "fleeting" || !last.NonPersistent {
		t.Fatalf("non-persistent message: %+v", last)
	}
}

func TestClientIndividualAckNackAndRedelivery(t *testing.T) {
	for _, version := range []string{"1.1", "1.2"} {
		t.Run(version, func(t *testing.T) {
			c := dial(t, pymq.Options{Version: version})
			dest := queue(t)
			for _, text := range []string{"m0", "m1", "m2"} {
				send(t, c, dest, pymq.NewTextMessage(text))
			}
			s := subscribe(t, c, dest, pymq.SubscribeOptions{Ack: pymq.AckClientIndividual})
			m0, m1, m2 := expect(t, s), expect(t, s), expect(t, s)
			if m0.Text()+m1.Text()+m2.Text() != "m0m1m2" {
				t.Fatalf("order: %s %s %s", m0.Text(), m1.Text(), m2.Text())
			}
			if err := m1.Ack(bg); err != nil {
				t.Fatal(err)
			}
			if err := m0.Nack(bg); err != nil {
				t.Fatal(err)
			}
			again := expect(t, s)
			if again.Text() != "m0" || !again.Redelivered || again.DeliveryCount != 2 {
				t.Fatalf("redelivery: %q redelivered=%v count=%d", again.Text(), again.Redelivered, again.DeliveryCount)
			}
			if err := again.Ack(bg); err != nil {
				t.Fatal(err)
			}
			if err := c.Close(); err != nil { // m2 was never acked: it goes back to the queue
				t.Fatal(err)
			}
			if left := drain(t, dest); strings.Join(left, ",") != "m2" {
				t.Fatalf("left on the queue: %v", left)
			}
		})
	}
}

func TestClientAckIsCumulative(t *testing.T) {
	c := dial(t, pymq.Options{})
	dest := queue(t)
	for _, text := range []string{"a", "b", "c"} {
		send(t, c, dest, pymq.NewTextMessage(text))
	}
	s := subscribe(t, c, dest, pymq.SubscribeOptions{Ack: pymq.AckClient})
	expect(t, s)
	b := expect(t, s)
	expect(t, s)
	if err := b.Ack(bg); err != nil {
		t.Fatal(err)
	}
	c.Close()
	if left := drain(t, dest); strings.Join(left, ",") != "c" {
		t.Fatalf("left on the queue: %v", left)
	}
}

func TestPrefetchLimitsOutstandingMessages(t *testing.T) {
	c := dial(t, pymq.Options{})
	dest := queue(t)
	send(t, c, dest, pymq.NewTextMessage("one"))
	send(t, c, dest, pymq.NewTextMessage("two"))
	s := subscribe(t, c, dest, pymq.SubscribeOptions{Ack: pymq.AckClientIndividual, Prefetch: 1})
	first := expect(t, s)
	if m := receive(t, s, 500*time.Millisecond); m != nil {
		t.Fatalf("prefetch 1 delivered a second message before the ack: %q", m.Text())
	}
	if err := first.Ack(bg); err != nil {
		t.Fatal(err)
	}
	if m := expect(t, s); m.Text() != "two" {
		t.Fatalf("got %q", m.Text())
	}
}

func TestTransactions(t *testing.T) {
	c := dial(t, pymq.Options{})
	dest := queue(t)
	s := subscribe(t, c, dest, pymq.SubscribeOptions{Ack: pymq.AckClientIndividual})
	tx, err := c.Begin(bg)
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{"t1", "t2"} {
		if err := tx.Send(bg, dest, pymq.NewTextMessage(text)); err != nil {
			t.Fatal(err)
		}
	}
	if m := receive(t, s, 300*time.Millisecond); m != nil {
		t.Fatalf("a transacted send was visible before commit: %q", m.Text())
	}
	if err := tx.Commit(bg); err != nil {
		t.Fatal(err)
	}
	t1, t2 := expect(t, s), expect(t, s)
	if t1.Text() != "t1" || t2.Text() != "t2" {
		t.Fatalf("got %q %q", t1.Text(), t2.Text())
	}
	aborted, _ := c.Begin(bg)
	if err := aborted.Send(bg, dest, pymq.NewTextMessage("never")); err != nil {
		t.Fatal(err)
	}
	if err := aborted.Ack(bg, t1); err != nil { // discarded with the transaction: t1 stays outstanding
		t.Fatal(err)
	}
	if err := aborted.Abort(bg); err != nil {
		t.Fatal(err)
	}
	committed, _ := c.Begin(bg)
	if err := committed.Ack(bg, t2); err != nil {
		t.Fatal(err)
	}
	if err := committed.Commit(bg); err != nil {
		t.Fatal(err)
	}
	if m := receive(t, s, 300*time.Millisecond); m != nil {
		t.Fatalf("an aborted send arrived: %q", m.Text())
	}
	c.Close()
	if left := drain(t, dest); strings.Join(left, ",") != "t1" {
		t.Fatalf("left on the queue: %v", left)
	}
}

func TestTopicsFanOutAndSelectorsSeeTypedProperties(t *testing.T) {
	c := dial(t, pymq.Options{})
	topic := strings.Replace(queue(t), "/queue/", "/topic/", 1)
	all := subscribe(t, c, topic, pymq.SubscribeOptions{})
	big := subscribe(t, c, topic, pymq.SubscribeOptions{Selector: "qty > 10"})
	for _, qty := range []int{5, 20} {
		m := pymq.NewTextMessage("qty")
		_ = m.SetProperty("qty", qty)
		send(t, c, topic, m)
	}
	if a, b := expect(t, all), expect(t, all); a.Properties["qty"] != int64(5) || b.Properties["qty"] != int64(20) {
		t.Fatalf("fan-out: %v %v", a.Properties, b.Properties)
	}
	if m := expect(t, big); m.Properties["qty"] != int64(20) {
		t.Fatalf("selector let through %v", m.Properties)
	}
	if m := receive(t, big, 300*time.Millisecond); m != nil {
		t.Fatalf("selector let through %v", m.Properties)
	}
}

func TestServerErrorsAreTypedAndEndTheConnection(t *testing.T) {
	c := dial(t, pymq.Options{})
	_, err := c.Subscribe(bg, queue(t), pymq.SubscribeOptions{Selector: "qty >"})
	var se *pymq.ServerError
	if !errors.As(err, &se) || se.Code != "invalid-selector" {
		t.Fatalf("want invalid-selector, got %v", err)
	}
	if err := c.Send(bg, queue(t), pymq.NewTextMessage("x")); !errors.As(err, &se) {
		t.Fatalf("the connection must stay failed, got %v", err)
	}
	c2 := dial(t, pymq.Options{})
	err = c2.Send(bg, "/bad/x", pymq.NewTextMessage("x"))
	if !errors.As(err, &se) || se.Code != "invalid-destination" || se.Fields["destination"] != "/bad/x" {
		t.Fatalf("want invalid-destination with its field, got %#v", err)
	}
}

func TestAnUnreadSubscriptionStallsNeitherSendsNorClose(t *testing.T) {
	c := dial(t, pymq.Options{})
	dest := queue(t)
	_ = subscribe(t, c, dest, pymq.SubscribeOptions{Prefetch: 2}) // credit 2: the broker holds the rest
	for i := 0; i < 10; i++ {
		send(t, c, dest, pymq.NewTextMessage("unread"))
	}
	if err := c.Close(); err != nil {
		t.Fatalf("close must get its receipt past the unread subscription: %v", err)
	}
}

func TestAutoAckAcknowledgesWhatReceiveReturnedOnly(t *testing.T) {
	c := dial(t, pymq.Options{})
	dest := queue(t)
	send(t, c, dest, pymq.NewTextMessage("taken"))
	send(t, c, dest, pymq.NewTextMessage("delivered, not received"))
	s := subscribe(t, c, dest, pymq.SubscribeOptions{})
	if m := expect(t, s); m.Text() != "taken" || m.Ack(bg) == nil {
		t.Fatalf("got %q; an auto message needs no Ack", m.Text())
	}
	c.Close()
	if left := drain(t, dest); strings.Join(left, ",") != "delivered, not received" {
		t.Fatalf("left on the queue: %v", left)
	}
}
