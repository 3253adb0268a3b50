// Package routing computes pymq's group affinity (seed 003) exactly as every other pymq engine and
// binding does: spec/routing.md §1–2, vectors spec/vectors/murmur3.json and group_routing.json.
//
// The hash is MurmurHash3 x86_32; group_hash(key) = murmur3(UTF-8 bytes of key, 0).  The destinations
// are made distinct and sorted by their UTF-8 bytes (Go's string order, which is code-point order).
// "modulo" routes to sorted[group_hash mod N]; "rendezvous" (the default) to the destination d with the
// highest murmur3(key, seed = group_hash(d)), the first in sorted order on equal scores.  A router is
// immutable; build a new one when the destination set changes.
package routing

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"sort"
)

// ErrNoDestination is returned for an empty destination set (Python: ClusterError "no valid destination").
var ErrNoDestination = errors.New("routing: no valid destination to route to")

// Murmur3 is MurmurHash3_x86_32 of data with the given seed.
func Murmur3(data []byte, seed uint32) uint32 {
	const c1, c2 = 0xcc9e2d51, 0x1b873593
	h := seed
	n := len(data)
	i := 0
	for ; i+4 <= n; i += 4 {
		k := binary.LittleEndian.Uint32(data[i:])
		k *= c1
		k = bits.RotateLeft32(k, 15)
		k *= c2
		h ^= k
		h = bits.RotateLeft32(h, 13)
		h = h*5 + 0xe6546b64
	}
	var k uint32
	switch n - i {
	case 3:
		k ^= uint32(data[i+2]) << 16
		fallthrough
	case 2:
		k ^= uint32(data[i+1]) << 8
		fallthrough
	case 1:
		k ^= uint32(data[i])
		k *= c1
		k = bits.RotateLeft32(k, 15)
		k *= c2
		h ^= k
	}
	h ^= uint32(n)
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

// GroupHash is the routing layer's one hash: murmur3(UTF-8(key), 0).
func GroupHash(key string) uint32 { return Murmur3([]byte(key), 0) }

// Strategy names a routing algorithm.
type Strategy string

const (
	// Rendezvous is highest-random-weight hashing: a membership change moves about 1/N of the groups.
	Rendezvous Strategy = "rendezvous"
	// Modulo is the seed's group_hash mod N over the sorted destinations.
	Modulo Strategy = "modulo"
)

// SortDestinations returns the canonical destination list: distinct, ascending by UTF-8 bytes.
func SortDestinations(destinations []string) ([]string, error) {
	seen := make(map[string]struct{}, len(destinations))
	out := make([]string, 0, len(destinations))
	for _, d := range destinations {
		if _, dup := seen[d]; !dup {
			seen[d] = struct{}{}
			out = append(out, d)
		}
	}
	if len(out) == 0 {
		return nil, ErrNoDestination
	}
	sort.Strings(out) // Go compares strings bytewise: UTF-8 byte order, as the spec requires
	return out, nil
}

// GroupRouter routes keys (group ids, message ids, correlation ids) over a fixed destination set.
type GroupRouter struct {
	destinations []string
	seeds        []uint32 // group_hash of each destination, computed once
	strategy     Strategy
}

// NewGroupRouter builds a router; strategy "" means Rendezvous.
func NewGroupRouter(destinations []string, strategy Strategy) (*GroupRouter, error) {
	if strategy == "" {
		strategy = Rendezvous
	}
	if strategy != Rendezvous && strategy != Modulo {
		return nil, fmt.Errorf("routing: unknown group routing strategy %q; expected rendezvous or modulo", strategy)
	}
	sorted, err := SortDestinations(destinations)
	if err != nil {
		return nil, err
	}
	seeds := make([]uint32, len(sorted))
	for i, d := range sorted {
		seeds[i] = GroupHash(d)
	}
	return &GroupRouter{destinations: sorted, seeds: seeds, strategy: strategy}, nil
}

// Destinations returns the distinct destinations in UTF-8 byte order (the order Modulo indexes).
func (r *GroupRouter) Destinations() []string { return append([]string(nil), r.destinations...) }

// Strategy returns the router's algorithm.
func (r *GroupRouter) Strategy() Strategy { return r.strategy }

// Scores returns the rendezvous score of key at every destination, in Destinations() order.
func (r *GroupRouter) Scores(key string) []uint32 {
	k := []byte(key)
	out := make([]uint32, len(r.seeds))
	for i, seed := range r.seeds {
		out[i] = Murmur3(k, seed)
	}
	return out
}

// Index returns the position in Destinations() of key's destination.
func (r *GroupRouter) Index(key string) int {
	if r.strategy == Modulo {
		return int(GroupHash(key) % uint32(len(r.destinations)))
	}
	best := 0
	scores := r.Scores(key)
	for i, s := range scores {
		if s > scores[best] { // strictly greater: ties stay with the first in sorted order
			best = i
		}
	}
	return best
}

// Route returns key's destination.
func (r *GroupRouter) Route(key string) string { return r.destinations[r.Index(key)] }

// Ranking returns every destination in key's order of preference; the first is Route(key).
// Rendezvous: descending score, ties in sorted order.  Modulo: the sorted list rotated to the routed index.
func (r *GroupRouter) Ranking(key string) []string {
	n := len(r.destinations)
	out := make([]string, 0, n)
	if r.strategy == Modulo {
		start := r.Index(key)
		out = append(out, r.destinations[start:]...)
		return append(out, r.destinations[:start]...)
	}
	scores := r.Scores(key)
	order := make([]int, n)
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return scores[order[a]] > scores[order[b]] })
	for _, i := range order {
		out = append(out, r.destinations[i])
	}
	return out
}

// RoutingKey says which id a destination routes its messages on (spec/routing.md §2.3): RouteOnGroup (the
// default), RouteOnCorrelationID or RouteOnMessageID.  A grouped message routes on its group whatever the
// setting: group order is a contract, the other ids only an affinity.
type RoutingKey string

// The routing keys, spelled as the broker's configuration spells them.
const (
	RouteOnGroup         RoutingKey = "group"
	RouteOnCorrelationID RoutingKey = "correlation-id"
	RouteOnMessageID     RoutingKey = "message-id"
)

// ParseRoutingKey checks a setting; names are exact and lower case.
func ParseRoutingKey(setting string) (RoutingKey, error) {
	switch k := RoutingKey(setting); k {
	case RouteOnGroup, RouteOnCorrelationID, RouteOnMessageID:
		return k, nil
	}
	return "", fmt.Errorf("routing: unknown routing_key %q; expected group, correlation-id or message-id", setting)
}

// KeyOf returns the key a message with these STOMP headers routes on and where it came from ("group",
// "correlation-id" or "message-id"); ok is false for an unkeyed message (not hash-routed).  "Present"
// means the header exists, even with an empty value.
func (k RoutingKey) KeyOf(headers map[string]string) (key, source string, ok bool) {
	if g, has := headers["JMSXGroupID"]; has {
		return g, "group", true
	}
	if k == RouteOnCorrelationID {
		if v, has := headers["correlation-id"]; has {
			return v, "correlation-id", true
		}
	}
	if k == RouteOnMessageID {
		if v, has := headers["message-id"]; has {
			return v, "message-id", true
		}
	}
	return "", "", false
}
