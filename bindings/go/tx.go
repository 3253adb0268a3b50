package pymq

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/pymq/pymq/bindings/go/stomp"
)

// Tx is a STOMP transaction: its sends, acks and nacks take effect together at Commit, or not at all.
// When its link is lost the broker aborts it (spec/ha.md §4.5): a transaction that had sent or acknowledged
// something is then rollback-only (its later calls go on, in a new transaction on the new link, and Commit
// aborts that and returns ErrTxLost); one that had done nothing simply goes on.  A Commit whose RECEIPT was
// lost with the link returns ErrTxInDoubt (applied whole or not at all; it is never sent again).
type Tx struct {
	ID   string
	conn *Conn

	mu           sync.Mutex
	gen          uint64
	worked       bool // sent, acked or nacked something in the current transaction
	rollbackOnly bool // lost with a link after doing something
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

// link is the transaction's link; when the link it began on was replaced, the transaction begins again on
// the new one (rollback-only if it had done something).
func (t *Tx) link(ctx context.Context) (*link, func(), error) {
	ctx, cancel := t.conn.bounded(ctx)
	l, err := t.conn.current(ctx)
	if err != nil {
		cancel()
		return nil, nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if l.gen != t.gen {
		if t.worked {
			t.rollbackOnly = true
		}
		if err := l.write(ctx, "BEGIN", []stomp.Header{{Name: "transaction", Value: t.ID}}, nil); err != nil {
			cancel()
			return nil, nil, err
		}
		t.gen, t.worked = l.gen, false
	}
	return l, cancel, nil
}

func (t *Tx) did() {
	t.mu.Lock()
	t.worked = true
	t.mu.Unlock()
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
	t.mu.Lock()
	lost := t.rollbackOnly
	t.rollbackOnly = false
	t.mu.Unlock()
	if lost {
		command = "ABORT"
	}
	wait, err := l.submit(ctx, command, []stomp.Header{{Name: "transaction", Value: t.ID}}, nil)
	if err != nil {
		if lost || (command == "COMMIT" && errors.Is(err, ErrDisconnected)) {
			return ErrTxLost // never sent: the broker aborted it with the link
		}
		return err
	}
	_, err = wait()
	switch {
	case lost:
		return ErrTxLost
	case err != nil && command == "COMMIT" && errors.Is(err, ErrDisconnected):
		return fmt.Errorf("%w: %v", ErrTxInDoubt, err)
	}
	return err
}
