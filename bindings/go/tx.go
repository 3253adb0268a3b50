package pymq

import (
	"context"

	"github.com/pymq/pymq/bindings/go/stomp"
)

// Tx is a STOMP transaction: its sends, acks and nacks take effect together at Commit, or not at all.  It
// lives on one link: if that link is lost, the broker aborts it and every later call returns ErrTxLost.
type Tx struct {
	ID   string
	conn *Conn
	gen  uint64
}

// Begin starts a transaction.
func (c *Conn) Begin(ctx context.Context) (*Tx, error) {
	ctx, cancel := c.bounded(ctx)
	defer cancel()
	l, err := c.current(ctx)
	if err != nil {
		return nil, err
	}
	tx := &Tx{ID: c.id("tx-"), conn: c, gen: l.gen}
	if err := l.write(ctx, "BEGIN", []stomp.Header{{Name: "transaction", Value: tx.ID}}, nil); err != nil {
		return nil, err
	}
	return tx, nil
}

// link is the transaction's link, or ErrTxLost when it was replaced.
func (t *Tx) link(ctx context.Context) (*link, func(), error) {
	ctx, cancel := t.conn.bounded(ctx)
	l, err := t.conn.current(ctx)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	if l.gen != t.gen {
		cancel()
		return nil, nil, ErrTxLost
	}
	return l, cancel, nil
}

// Send sends m inside the transaction.
func (t *Tx) Send(ctx context.Context, destination string, m *Message) error {
	return t.conn.send(ctx, destination, m, t)
}

// Ack acknowledges m inside the transaction.
func (t *Tx) Ack(ctx context.Context, m *Message) error {
	return t.conn.acknowledge(ctx, m, "ACK", t, false)
}

// Nack returns m for redelivery inside the transaction.
func (t *Tx) Nack(ctx context.Context, m *Message) error {
	return t.conn.acknowledge(ctx, m, "NACK", t, false)
}

// Commit applies the transaction and waits for the broker to confirm it.
func (t *Tx) Commit(ctx context.Context) error {
	return t.finish(ctx, "COMMIT")
}

// Abort discards the transaction's sends; messages acked in it stay unacknowledged.
func (t *Tx) Abort(ctx context.Context) error {
	return t.finish(ctx, "ABORT")
}

func (t *Tx) finish(ctx context.Context, command string) error {
	ctx, cancel := t.conn.bounded(ctx)
	defer cancel()
	l, done, err := t.link(ctx)
	if err != nil {
		return err
	}
	defer done()
	_, err = l.request(ctx, command, []stomp.Header{{Name: "transaction", Value: t.ID}}, nil)
	return err
}
