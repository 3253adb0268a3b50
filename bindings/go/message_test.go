package pymq_test

import (
	"bytes"
	"encoding/base64"
	"encoding/hex"
	"reflect"
	"testing"

	pymq "github.com/pymq/pymq/bindings/go"
	"github.com/pymq/pymq/bindings/go/internal/vectors"
	"github.com/pymq/pymq/bindings/go/stomp"
)

type typedValue struct {
	Type  string `json:"type"`
	Value any    `json:"value"`
}

type messageCase struct {
	Name    string      `json:"name"`
	Headers [][2]string `json:"headers"`
	BodyHex string      `json:"body_hex"`
	Expect  struct {
		Kind          string                `json:"kind"`
		Text          string                `json:"text"`
		BytesHex      string                `json:"bytes_hex"`
		Map           map[string]any        `json:"map"`
		MessageID     *string               `json:"message_id"`
		Destination   *string               `json:"destination"`
		Persistent    bool                  `json:"persistent"`
		Priority      int                   `json:"priority"`
		Timestamp     int64                 `json:"timestamp"`
		Expires       int64                 `json:"expires"`
		CorrelationID *string               `json:"correlation_id"`
		ReplyTo       *string               `json:"reply_to"`
		Type          *string               `json:"type"`
		Redelivered   bool                  `json:"redelivered"`
		DeliveryCount int                   `json:"delivery_count"`
		Sequence      *int64                `json:"sequence"`
		GroupID       *string               `json:"group_id"`
		Properties    map[string]typedValue `json:"properties"`
	} `json:"expect"`
}

func str(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}

// jsonView turns a decoded property or map value into what the vectors' JSON holds.
func jsonView(v any) any {
	switch x := v.(type) {
	case int64:
		return float64(x)
	case []byte:
		return map[string]any{"$bytes": base64.StdEncoding.EncodeToString(x)}
	}
	return v
}

func typeName(v any) string {
	switch v.(type) {
	case int64:
		return "int"
	case float64:
		return "float"
	case bool:
		return "bool"
	case string:
		return "string"
	}
	return "?"
}

// TestMessageVectors decodes every frame of spec/vectors/messages.json as the Python SDK does.
func TestMessageVectors(t *testing.T) {
	var v struct {
		Cases []messageCase `json:"cases"`
	}
	if err := vectors.Load("messages.json", &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Cases) == 0 {
		t.Fatal("no message vectors")
	}
	for _, c := range v.Cases {
		c := c
		t.Run(c.Name, func(t *testing.T) {
			body, _ := hex.DecodeString(c.BodyHex)
			f := &stomp.Frame{Command: "MESSAGE", Body: body}
			for _, h := range c.Headers {
				f.Headers = append(f.Headers, stomp.Header{Name: h[0], Value: h[1]})
			}
			m := pymq.MessageFromFrame(f)
			e := c.Expect
			if m.Kind().String() != e.Kind {
				t.Fatalf("kind %s, want %s", m.Kind(), e.Kind)
			}
			switch e.Kind {
			case "text":
				if m.Text() != e.Text {
					t.Fatalf("text %q, want %q", m.Text(), e.Text)
				}
			case "bytes":
				if hex.EncodeToString(m.Body) != e.BytesHex {
					t.Fatalf("bytes %x, want %s", m.Body, e.BytesHex)
				}
			case "map":
				got, err := m.Map()
				if err != nil {
					t.Fatal(err)
				}
				view := map[string]any{}
				for k, val := range got {
					view[k] = jsonView(val)
				}
				if !reflect.DeepEqual(view, e.Map) {
					t.Fatalf("map %v, want %v", view, e.Map)
				}
			}
			checks := []struct {
				name      string
				got, want any
			}{
				{"message_id", m.ID, str(e.MessageID)},
				{"destination", m.Destination, str(e.Destination)},
				{"persistent", !m.NonPersistent, e.Persistent},
				{"priority", m.Priority, e.Priority},
				{"timestamp", m.Timestamp, e.Timestamp},
				{"expires", m.Expires, e.Expires},
				{"correlation_id", m.CorrelationID, str(e.CorrelationID)},
				{"reply_to", m.ReplyTo, str(e.ReplyTo)},
				{"type", m.Type, str(e.Type)},
				{"redelivered", m.Redelivered, e.Redelivered},
				{"delivery_count", m.DeliveryCount, e.DeliveryCount},
				{"has sequence", m.HasSequence, e.Sequence != nil},
				{"group_id", m.GroupID(), str(e.GroupID)},
			}
			if e.Sequence != nil {
				checks = append(checks, struct {
					name      string
					got, want any
				}{"sequence", m.Sequence, *e.Sequence})
			}
			for _, ch := range checks {
				if !reflect.DeepEqual(ch.got, ch.want) {
					t.Errorf("%s = %#v, want %#v", ch.name, ch.got, ch.want)
				}
			}
			if len(m.Properties) != len(e.Properties) {
				t.Fatalf("properties %v, want %v", m.Properties, e.Properties)
			}
			for name, want := range e.Properties {
				got, ok := m.Properties[name]
				if !ok || typeName(got) != want.Type || !reflect.DeepEqual(jsonView(got), want.Value) {
					t.Errorf("property %s = %#v (%s), want %v (%s)", name, got, typeName(got), want.Value, want.Type)
				}
			}
		})
	}
}

func TestPropertyNamesValuesAndMapBodies(t *testing.T) {
	m := pymq.NewTextMessage("x")
	for name, value := range map[string]any{"i": 42, "f": 0.1, "whole": 3.0, "b": true, "s": "a:b\nc"} {
		if err := m.SetProperty(name, value); err != nil {
			t.Fatal(err)
		}
	}
	for _, bad := range []string{"", "a,b", "a=b", "destination", "priority"} {
		if m.SetProperty(bad, "x") == nil {
			t.Errorf("property name %q must be refused", bad)
		}
	}
	if m.SetProperty("x", []int{1}) == nil {
		t.Error("a slice is not a property value")
	}
	msg, err := pymq.NewMapMessage(map[string]any{"n": 1, "b": []byte{0, 255}, "f": 1.5, "nil": nil})
	if err != nil {
		t.Fatal(err)
	}
	got, err := msg.Map()
	if err != nil || got["n"] != int64(1) || !bytes.Equal(got["b"].([]byte), []byte{0, 255}) ||
		got["f"] != 1.5 || got["nil"] != nil {
		t.Fatalf("map round trip: %v %v", got, err)
	}
}

// TestTheDedupIdIsAHeaderNotAProperty: pymq-dedup-id is reserved as in the Python SDK's from_frame.
func TestTheDedupIdIsAHeaderNotAProperty(t *testing.T) {
	m := pymq.MessageFromFrame(&stomp.Frame{Command: "MESSAGE", Headers: []stomp.Header{
		{Name: "pymq-dedup-id", Value: "d-1"}, {Name: "kept", Value: "yes"}}})
	if _, ok := m.Properties["pymq-dedup-id"]; ok || m.Properties["kept"] != "yes" {
		t.Fatalf("properties %v", m.Properties)
	}
}
