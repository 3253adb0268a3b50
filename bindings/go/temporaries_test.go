package pymq_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	pymq "github.com/pymq/pymq/bindings/go"
)

// TestTemporaryNamesSurviveATakeover (spec/ha.md §4.7): a requester's temporary reply queue keeps its global
// name across a kill -9 of the live of a real pair, because the reconnection offers the re-claim token of
// the lost link's CONNECTED (signed with the key in the shared store, so the backup verifies it): the reply
// the responder sends to the old name afterwards arrives, and OnStatus reports the reconnection without
// TemporariesRenamed.  A second requester whose token was forged (its mac changed) is refused: OnStatus
// says its temporaries were renamed ("does not verify"), and nothing was made under its old name (a SEND
// there is unknown-destination).
func TestTemporaryNamesSurviveATakeover(t *testing.T) {
	a, b, portB := haPair(t)
	url := "failover:(stomp://" + a.addr + ",stomp://127.0.0.1:" + portB + ")?initialReconnectDelay=50&maxReconnectDelay=400&jitter=0"
	dialLogged := func() (*pymq.Conn, *statusLog) {
		log := newStatusLog()
		c, err := pymq.Dial(url, pymq.Options{OnStatus: log.record})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c, log
	}
	requester, rLog := dialLogged()
	forger, fLog := dialLogged()
	responder, _ := dialLogged()
	service := queue(t)
	ask := func(c *pymq.Conn, local string) *pymq.Subscription {
		replies := subscribe(t, c, local, pymq.SubscribeOptions{})
		m := pymq.NewTextMessage("question")
		m.ReplyTo = local
		send(t, c, service, m)
		return replies
	}
	tag := strconv.FormatInt(time.Now().UnixNano(), 36)
	answers := ask(requester, "/temp-queue/answers-"+tag)
	forged := ask(forger, "/temp-queue/answers-"+tag)
	requests := subscribe(t, responder, service, pymq.SubscribeOptions{})
	replyTo := [2]string{expect(t, requests).ReplyTo, expect(t, requests).ReplyTo}
	for _, name := range replyTo {
		if !strings.HasPrefix(name, "/temp-queue/tmp.") {
			t.Fatalf("the responder got reply-to %q, not a global temporary name", name)
		}
	}
	if replyTo[0] == replyTo[1] {
		t.Fatalf("two connections' temporaries share the global name %q", replyTo[0])
	}
	token := pymq.ReclaimToken(requester)
	if token == "" || pymq.ReclaimToken(forger) == "" {
		t.Fatal("the broker gave no pymq-reclaim-token")
	}
	pymq.EditReclaimToken(forger, func(tok string) string { // the same names, another mac
		last := tok[len(tok)-1]
		if last == 'A' {
			return tok[:len(tok)-1] + "B"
		}
		return tok[:len(tok)-1] + "A"
	})

	kill9(a)
	b.awaitLive(t, 60*time.Second)
	rLog.await(t, pymq.StatusOpen, 2, 60*time.Second)
	fLog.await(t, pymq.StatusOpen, 2, 60*time.Second)
	if errs := rLog.errorsWith(pymq.StatusOpen); errs[1] != nil {
		t.Fatalf("the requester's temporaries were renamed: %v", errs[1])
	}
	var renamed *pymq.TemporariesRenamed
	if errs := fLog.errorsWith(pymq.StatusOpen); !errors.As(errs[1], &renamed) || !strings.Contains(renamed.Reason, "does not verify") {
		t.Fatalf("a forged token: want TemporariesRenamed (does not verify), got %v", errs[1])
	}
	if pymq.ReclaimToken(requester) != token { // the same names, so the same token for the next loss
		t.Fatal("the re-claiming link's CONNECTED gave another token")
	}
	send(t, responder, replyTo[0], pymq.NewTextMessage("answer"))
	if got := expect(t, answers); got.Text() != "answer" {
		t.Fatalf("the requester got %q", got.Text())
	}
	ctx, cancel := context.WithTimeout(bg, 10*time.Second)
	defer cancel()
	err := responder.Send(ctx, replyTo[1], pymq.NewTextMessage("to the forged names"))
	var se *pymq.ServerError
	if !errors.As(err, &se) || se.Code != "unknown-destination" {
		t.Fatalf("a SEND to the names of a refused re-claim: want unknown-destination, got %v", err)
	}
	if extra := receive(t, forged, 300*time.Millisecond); extra != nil {
		t.Fatalf("the forger's new queue got %q", extra.Text())
	}
}
