package routing

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"reflect"
	"testing"

	"github.com/pymq/pymq/bindings/go/internal/vectors"
)

type murmurVectors struct {
	Vectors []struct {
		InputHex string `json:"input_hex"`
		Seed     uint32 `json:"seed"`
		Hash     uint32 `json:"hash"`
	} `json:"vectors"`
	Verification struct {
		Expected uint32 `json:"expected"`
	} `json:"verification"`
}

func TestMurmur3Vectors(t *testing.T) {
	var v murmurVectors
	if err := vectors.Load("murmur3.json", &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Vectors) == 0 {
		t.Fatal("no murmur3 vectors")
	}
	for _, c := range v.Vectors {
		data, err := hex.DecodeString(c.InputHex)
		if err != nil {
			t.Fatal(err)
		}
		if got := Murmur3(data, c.Seed); got != c.Hash {
			t.Errorf("murmur3(%s, %d) = %d, want %d", c.InputHex, c.Seed, got, c.Hash)
		}
	}
}

// TestSMHasherVerification runs SMHasher's self-test procedure, as murmur3.json describes it.
func TestSMHasherVerification(t *testing.T) {
	var v murmurVectors
	if err := vectors.Load("murmur3.json", &v); err != nil {
		t.Fatal(err)
	}
	key := make([]byte, 256)
	results := make([]byte, 0, 1024)
	for i := 0; i < 256; i++ {
		key[i] = byte(i)
		results = binary.LittleEndian.AppendUint32(results, Murmur3(key[:i], uint32(256-i)))
	}
	if got := Murmur3(results, 0); got != v.Verification.Expected || got != 0xb0f57ee3 {
		t.Fatalf("verification %#x, want %#x", got, v.Verification.Expected)
	}
}

type routingCase struct {
	Name              string   `json:"name"`
	Key               string   `json:"key"`
	KeyHex            string   `json:"key_hex"`
	Destinations      []string `json:"destinations"`
	Sorted            []string `json:"sorted"`
	DestinationHashes []uint32 `json:"destination_hashes"`
	GroupHash         uint32   `json:"group_hash"`
	ModuloIndex       int      `json:"modulo_index"`
	Modulo            string   `json:"modulo"`
	RendezvousScores  []uint32 `json:"rendezvous_scores"`
	Rendezvous        string   `json:"rendezvous"`
	RendezvousRanking []string `json:"rendezvous_ranking"`
}

type routingVectors struct {
	Cases  []routingCase `json:"cases"`
	Errors []struct {
		Destinations []string `json:"destinations"`
		Error        string   `json:"error"`
	} `json:"errors"`
	KeyCases []struct {
		Name         string            `json:"name"`
		RoutingKey   string            `json:"routing_key"`
		Headers      map[string]string `json:"headers"`
		KeySource    *string           `json:"key_source"`
		Key          *string           `json:"key"`
		Destinations []string          `json:"destinations"`
		Modulo       *string           `json:"modulo"`
		Rendezvous   *string           `json:"rendezvous"`
	} `json:"key_cases"`
	KeyErrors []struct {
		RoutingKey string `json:"routing_key"`
		Error      string `json:"error"`
	} `json:"key_errors"`
}

// TestRoutingKeyVectors: key_cases, which id a message routes on under a destination's routing_key.
func TestRoutingKeyVectors(t *testing.T) {
	var v routingVectors
	if err := vectors.Load("group_routing.json", &v); err != nil {
		t.Fatal(err)
	}
	if len(v.KeyCases) < 10 {
		t.Fatalf("only %d key cases", len(v.KeyCases))
	}
	for _, c := range v.KeyCases {
		k, err := ParseRoutingKey(c.RoutingKey)
		if err != nil {
			t.Fatal(err)
		}
		key, source, ok := k.KeyOf(c.Headers)
		if c.KeySource == nil {
			if ok || c.Modulo != nil || c.Rendezvous != nil {
				t.Errorf("%s: want unkeyed, got %q from %s", c.Name, key, source)
			}
			continue
		}
		if !ok || source != *c.KeySource || key != *c.Key {
			t.Errorf("%s: got %q from %q, want %q from %q", c.Name, key, source, *c.Key, *c.KeySource)
			continue
		}
		mod, _ := NewGroupRouter(c.Destinations, Modulo)
		hrw, _ := NewGroupRouter(c.Destinations, Rendezvous)
		if mod.Route(key) != *c.Modulo || hrw.Route(key) != *c.Rendezvous {
			t.Errorf("%s: routes %q %q, want %q %q", c.Name, mod.Route(key), hrw.Route(key), *c.Modulo, *c.Rendezvous)
		}
	}
	for _, e := range v.KeyErrors {
		if _, err := ParseRoutingKey(e.RoutingKey); err == nil {
			t.Errorf("routing_key %q must be refused", e.RoutingKey)
		}
	}
}

func TestGroupRoutingVectors(t *testing.T) {
	var v routingVectors
	if err := vectors.Load("group_routing.json", &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) == 0 {
		t.Fatal("no group routing vectors")
	}
	for _, c := range v.Cases {
		c := c
		t.Run(c.Name, func(t *testing.T) {
			if hex.EncodeToString([]byte(c.Key)) != c.KeyHex {
				t.Fatalf("key %q does not encode to %s", c.Key, c.KeyHex)
			}
			mod, err := NewGroupRouter(c.Destinations, Modulo)
			if err != nil {
				t.Fatal(err)
			}
			hrw, err := NewGroupRouter(c.Destinations, "")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(mod.Destinations(), c.Sorted) {
				t.Fatalf("sorted %q, want %q", mod.Destinations(), c.Sorted)
			}
			for i, d := range c.Sorted {
				if GroupHash(d) != c.DestinationHashes[i] {
					t.Fatalf("group_hash(%q) = %d, want %d", d, GroupHash(d), c.DestinationHashes[i])
				}
			}
			if GroupHash(c.Key) != c.GroupHash {
				t.Fatalf("group_hash(key) = %d, want %d", GroupHash(c.Key), c.GroupHash)
			}
			if mod.Index(c.Key) != c.ModuloIndex || mod.Route(c.Key) != c.Modulo {
				t.Fatalf("modulo %d %q, want %d %q", mod.Index(c.Key), mod.Route(c.Key), c.ModuloIndex, c.Modulo)
			}
			if !reflect.DeepEqual(hrw.Scores(c.Key), c.RendezvousScores) {
				t.Fatalf("scores %v, want %v", hrw.Scores(c.Key), c.RendezvousScores)
			}
			if hrw.Route(c.Key) != c.Rendezvous {
				t.Fatalf("rendezvous %q, want %q", hrw.Route(c.Key), c.Rendezvous)
			}
			if !reflect.DeepEqual(hrw.Ranking(c.Key), c.RendezvousRanking) {
				t.Fatalf("ranking %q, want %q", hrw.Ranking(c.Key), c.RendezvousRanking)
			}
			ranking := mod.Ranking(c.Key)
			if ranking[0] != c.Modulo || len(ranking) != len(c.Sorted) {
				t.Fatalf("modulo ranking %q must start at %q", ranking, c.Modulo)
			}
		})
	}
	for _, e := range v.Errors {
		if _, err := NewGroupRouter(e.Destinations, ""); !errors.Is(err, ErrNoDestination) {
			t.Errorf("%v: want ErrNoDestination, got %v", e.Destinations, err)
		}
	}
}

func TestUnknownStrategy(t *testing.T) {
	if _, err := NewGroupRouter([]string{"a"}, "round-robin"); err == nil {
		t.Fatal("an unknown strategy must be refused")
	}
}

func TestRendezvousMovesOnlyTheLeaversGroups(t *testing.T) {
	before, _ := NewGroupRouter([]string{"n1", "n2", "n3", "n4"}, Rendezvous)
	after, _ := NewGroupRouter([]string{"n1", "n2", "n4"}, Rendezvous)
	moved := 0
	for i := 0; i < 2000; i++ {
		key := "group-" + string(rune('a'+i%26)) + hex.EncodeToString([]byte{byte(i), byte(i >> 8)})
		b, a := before.Route(key), after.Route(key)
		if b != a {
			if b != "n3" {
				t.Fatalf("%s moved from %s to %s although %s stayed", key, b, a, b)
			}
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("the leaver owned no group: the test proves nothing")
	}
}
