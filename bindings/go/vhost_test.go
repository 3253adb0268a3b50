package pymq_test

import (
	"errors"
	"strconv"
	"testing"
	"time"

	pymq "github.com/pymq/pymq/bindings/go"
)

// TestVirtualHostsKeepTheirQueuesApart: the URL's path (spec/stomp.md §1), a failover member's path and
// Options.VHost select the broker's virtual host; one queue name in two vhosts and in the default vhost is
// three queues, each with only its own messages; an unknown vhost is refused at CONNECT.
func TestVirtualHostsKeepTheirQueuesApart(t *testing.T) {
	b := ownBroker(t, writeConfig(t, "vhosts:\n  shop: [\"*\"]\n  books: [\"*\"]\n")...)
	name := "/queue/go-vhost-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	dial := func(url string, opts pymq.Options) *pymq.Conn {
		t.Helper()
		c, err := pymq.Dial(url, opts)
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	shop := dial("stomp://"+b.addr+"/shop", pymq.Options{})
	books := dial("failover:(stomp://"+b.addr+"/books)", pymq.Options{})
	byOption := dial(b.addr, pymq.Options{VHost: "shop"})
	plain := dial("stomp://"+b.addr, pymq.Options{})
	send(t, shop, name, pymq.NewTextMessage("for the shop"))
	send(t, books, name, pymq.NewTextMessage("for the books"))
	send(t, plain, name, pymq.NewTextMessage("for the default vhost"))
	for who, c := range map[string]*pymq.Conn{"books": books, "shop (the option)": byOption, "/": plain} {
		want := map[string]string{"books": "for the books", "shop (the option)": "for the shop",
			"/": "for the default vhost"}[who]
		s := subscribe(t, c, name, pymq.SubscribeOptions{})
		if got := expect(t, s); got.Text() != want {
			t.Fatalf("%s reads %q from %s, want %q", who, got.Text(), name, want)
		}
		if extra := receive(t, s, 300*time.Millisecond); extra != nil {
			t.Fatalf("%s also reads %q: the vhosts share a queue", who, extra.Text())
		}
	}
	_, err := pymq.Dial("stomp://"+b.addr+"/nowhere", pymq.Options{})
	var se *pymq.ServerError
	if !errors.As(err, &se) || se.Code != "access-denied" {
		t.Fatalf("an unknown vhost: want an access-denied ServerError, got %v", err)
	}
	if _, err := pymq.ParseBrokerURL("failover:(stomp://a:1/no/such)"); err == nil {
		t.Fatal("a path that is not a vhost name was accepted")
	}
}
