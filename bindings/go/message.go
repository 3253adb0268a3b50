package pymq

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/pymq/pymq/bindings/go/stomp"
)

// Body content types of spec/stomp.md §7.
const (
	TextType  = "text/plain;charset=utf-8"
	BytesType = "application/octet-stream"
	MapType   = "application/x-pymq-map+json"
)

// DefaultPriority is the JMS default priority (0–9).
const DefaultPriority = 4

// Kind is a message's JMS body type.
type Kind int

// Body types: TextMessage, BytesMessage and MapMessage in JMS terms.
const (
	TextKind Kind = iota
	BytesKind
	MapKind
)

func (k Kind) String() string {
	switch k {
	case TextKind:
		return "text"
	case BytesKind:
		return "bytes"
	}
	return "map"
}

// reserved headers are JMS header fields or protocol machinery, never properties (as the Python SDK).
var reserved = map[string]bool{
	"destination": true, "message-id": true, "subscription": true, "ack": true, "receipt": true,
	"transaction": true, "content-length": true, "content-type": true, "persistent": true, "priority": true,
	"expires": true, "expiration": true, "timestamp": true, "correlation-id": true, "reply-to": true,
	"type": true, "redelivered": true, "pymq-types": true, "pymq-seq": true, "transformation": true,
	"browser": true, "pymq-dedup-id": true, "pymq-jms-types": true,
}

// Message is a JMS message as pymq carries it over STOMP.
//
// Build one with NewTextMessage, NewBytesMessage or NewMapMessage (they set the JMS defaults: persistent,
// priority 4).  Properties hold string, int64, float64 or bool values; the types cross the wire in the
// pymq-types header, so a pymq client in any language gets the same types back and foreign clients see
// plain strings.  Received messages also carry the broker's fields (ID, Redelivered, DeliveryCount,
// Sequence) and the raw Headers.
type Message struct {
	// ContentType is the body's MIME type; the constructors set it.  "" sends no content-type.
	ContentType string
	Body        []byte

	ID            string // message-id: the broker's; after a receipted Send, the id it gave the message
	Destination   string // "/queue/x", "/topic/x" or "/temp-queue/x"
	CorrelationID string
	ReplyTo       string
	Type          string
	NonPersistent bool  // JMS delivery mode NON_PERSISTENT; the zero value is persistent, as on the broker
	Priority      int   // 0–9
	Expires       int64 // absolute expiry, ms since the epoch; 0 = never
	Timestamp     int64 // ms since the epoch; Send sets it when 0
	Redelivered   bool
	DeliveryCount int   // JMSXDeliveryCount: 1 on the first delivery
	Sequence      int64 // pymq-seq; 0 when absent
	HasSequence   bool
	Properties    map[string]any
	Headers       []stomp.Header // the MESSAGE frame's headers, as received
	// DedupID is the pymq-dedup-id (spec/stomp.md §9): the broker drops a second message with the same id
	// on the same destination within its window.  A reconnecting connection gives every Send one when it
	// is empty (spec/ha.md §4.4).
	DedupID string

	transformation string
	delivery       *delivery // how to acknowledge it; nil for messages not received from a subscription
}

// NewTextMessage returns a TextMessage holding text.
func NewTextMessage(text string) *Message {
	return &Message{ContentType: TextType, Body: []byte(text), Priority: DefaultPriority, DeliveryCount: 1,
		Properties: map[string]any{}}
}

// NewBytesMessage returns a BytesMessage holding data.
func NewBytesMessage(data []byte) *Message {
	return &Message{ContentType: BytesType, Body: append([]byte(nil), data...), Priority: DefaultPriority,
		DeliveryCount: 1, Properties: map[string]any{}}
}

// NewMapMessage returns a MapMessage; values are string, bool, integers, float64, []byte or nil.
func NewMapMessage(values map[string]any) (*Message, error) {
	out := make(map[string]any, len(values))
	for k, v := range values {
		switch x := v.(type) {
		case nil, string, bool, float64, int64:
			out[k] = x
		case int:
			out[k] = int64(x)
		case int32:
			out[k] = int64(x)
		case float32:
			out[k] = float64(x)
		case []byte:
			out[k] = map[string]string{"$bytes": base64.StdEncoding.EncodeToString(x)}
		default:
			return nil, fmt.Errorf("pymq: map value %q must be string, bool, number, []byte or nil, not %T", k, v)
		}
	}
	body, err := json.Marshal(out)
	if err != nil {
		return nil, fmt.Errorf("pymq: map message: %w", err)
	}
	return &Message{ContentType: MapType, Body: body, Priority: DefaultPriority, DeliveryCount: 1,
		Properties: map[string]any{}}, nil
}

// Kind decodes the body type from content-type (spec/stomp.md §7): the map type (or ActiveMQ's
// transformation jms-map-json) is a map; text/*, application/json and application/xml are text; any other
// type is bytes; without a content-type, a valid UTF-8 body is text and anything else bytes.
func (m *Message) Kind() Kind {
	base := strings.ToLower(strings.TrimSpace(strings.SplitN(m.ContentType, ";", 2)[0]))
	switch {
	case base == MapType || m.transformation == "jms-map-json":
		return MapKind
	case strings.HasPrefix(base, "text/") || base == "application/json" || base == "application/xml":
		return TextKind
	case base != "":
		return BytesKind
	case utf8.Valid(m.Body):
		return TextKind
	}
	return BytesKind
}

// Text returns the body as text, decoded with the content-type's charset (UTF-8 unless it names
// ISO-8859-1/Latin-1 or US-ASCII; invalid UTF-8 becomes U+FFFD).
func (m *Message) Text() string {
	switch charset(m.ContentType) {
	case "iso-8859-1", "latin-1", "latin1", "l1", "iso8859-1", "us-ascii", "ascii":
		runes := make([]rune, len(m.Body))
		for i, b := range m.Body {
			runes[i] = rune(b)
		}
		return string(runes)
	}
	if utf8.Valid(m.Body) {
		return string(m.Body)
	}
	return strings.ToValidUTF8(string(m.Body), "\uFFFD")
}

func charset(contentType string) string {
	parts := strings.Split(contentType, ";")
	for _, part := range parts[1:] {
		k, v, ok := strings.Cut(strings.TrimSpace(part), "=")
		if ok && strings.EqualFold(k, "charset") && v != "" {
			return strings.ToLower(strings.Trim(v, `"`))
		}
	}
	return "utf-8"
}

// Map decodes a MapMessage body: JSON scalars become string, bool, int64 (integers) or float64, a
// {"$bytes": base64} object becomes []byte, JSON null nil.
func (m *Message) Map() (map[string]any, error) {
	out := map[string]any{}
	if len(m.Body) == 0 {
		return out, nil
	}
	dec := json.NewDecoder(bytes.NewReader(m.Body))
	dec.UseNumber()
	var raw map[string]any
	if err := dec.Decode(&raw); err != nil {
		return nil, fmt.Errorf("pymq: map message body is not a JSON object: %w", err)
	}
	for k, v := range raw {
		switch x := v.(type) {
		case json.Number:
			if strings.ContainsAny(x.String(), ".eE") {
				f, err := x.Float64()
				if err != nil {
					return nil, fmt.Errorf("pymq: map value %q: %w", k, err)
				}
				out[k] = f
			} else if i, err := x.Int64(); err == nil {
				out[k] = i
			} else {
				return nil, fmt.Errorf("pymq: map value %q: integer %s does not fit in int64", k, x)
			}
		case map[string]any:
			b64, ok := x["$bytes"].(string)
			if !ok {
				return nil, fmt.Errorf("pymq: map value %q is an object other than {\"$bytes\": ...}", k)
			}
			data, err := base64.StdEncoding.DecodeString(b64)
			if err != nil {
				return nil, fmt.Errorf("pymq: map value %q: %w", k, err)
			}
			out[k] = data
		default:
			out[k] = x
		}
	}
	return out, nil
}

// SetProperty sets a typed property.  Names must be non-empty, must not be a JMS header name, and must
// not contain ',', '=' or line breaks; values are string, bool, any integer type (kept as int64) or a
// finite float64/float32.
func (m *Message) SetProperty(name string, value any) error {
	if name == "" || reserved[name] {
		return fmt.Errorf("pymq: %q is a header, not a property name", name)
	}
	if strings.ContainsAny(name, ",=\n\r") {
		return fmt.Errorf("pymq: property name %q must not contain ',', '=' or line breaks", name)
	}
	var v any
	switch x := value.(type) {
	case string, bool, int64:
		v = x
	case int:
		v = int64(x)
	case int8:
		v = int64(x)
	case int16:
		v = int64(x)
	case int32:
		v = int64(x)
	case uint8:
		v = int64(x)
	case uint16:
		v = int64(x)
	case uint32:
		v = int64(x)
	case float32:
		v = float64(x)
	case float64:
		v = x
	default:
		return fmt.Errorf("pymq: property %q must be string, bool, integer or float, not %T", name, value)
	}
	if f, ok := v.(float64); ok && (math.IsNaN(f) || math.IsInf(f, 0)) {
		return fmt.Errorf("pymq: property %q must be a finite number", name)
	}
	if m.Properties == nil {
		m.Properties = map[string]any{}
	}
	m.Properties[name] = v
	return nil
}

// GroupID is the JMSXGroupID property ("" when none): every message of a group goes to one consumer.
func (m *Message) GroupID() string {
	s, _ := m.Properties["JMSXGroupID"].(string)
	return s
}

// SetGroupID sets JMSXGroupID ("" removes it).
func (m *Message) SetGroupID(group string) {
	if group == "" {
		delete(m.Properties, "JMSXGroupID")
		return
	}
	_ = m.SetProperty("JMSXGroupID", group)
}

// sendHeaders are the SEND headers for m (destination excluded), as the Python SDK writes them.
func (m *Message) sendHeaders() []stomp.Header {
	h := make([]stomp.Header, 0, 8+len(m.Properties))
	if m.ContentType != "" {
		h = append(h, stomp.Header{Name: "content-type", Value: m.ContentType})
	}
	persistent := "true"
	if m.NonPersistent {
		persistent = "false"
	}
	h = append(h, stomp.Header{Name: "persistent", Value: persistent})
	if m.Priority != DefaultPriority {
		h = append(h, stomp.Header{Name: "priority", Value: strconv.Itoa(m.Priority)})
	}
	if m.Expires != 0 {
		h = append(h, stomp.Header{Name: "expires", Value: strconv.FormatInt(m.Expires, 10)})
	}
	if m.Timestamp != 0 {
		h = append(h, stomp.Header{Name: "timestamp", Value: strconv.FormatInt(m.Timestamp, 10)})
	}
	for _, f := range [][2]string{{"correlation-id", m.CorrelationID}, {"reply-to", m.ReplyTo}, {"type", m.Type},
		{"pymq-dedup-id", m.DedupID}} {
		if f[1] != "" {
			h = append(h, stomp.Header{Name: f[0], Value: f[1]})
		}
	}
	names := make([]string, 0, len(m.Properties))
	for name := range m.Properties {
		names = append(names, name)
	}
	sort.Strings(names) // a stable wire form
	var types []string
	for _, name := range names {
		var value, code string
		switch x := m.Properties[name].(type) {
		case string:
			value = x
		case bool:
			value, code = strconv.FormatBool(x), "b"
		case int64:
			value, code = strconv.FormatInt(x, 10), "i"
		case float64:
			// shortest text that reads back to the same float64 (Python's repr does the same)
			value, code = strconv.FormatFloat(x, 'g', -1, 64), "f"
		default:
			value = fmt.Sprint(x)
		}
		h = append(h, stomp.Header{Name: name, Value: value})
		if code != "" {
			types = append(types, name+"="+code)
		}
	}
	if len(names) > 0 {
		// even empty: a message with pymq-types is typed, so the broker's selectors keep its strings strings
		// (a plain header without it compares as a number when it reads as one: spec/selector.md section 3)
		h = append(h, stomp.Header{Name: "pymq-types", Value: strings.Join(types, ",")})
	}
	return h
}

func intOr(s string, ok bool, def int64) int64 {
	if !ok {
		return def
	}
	v, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil {
		return def
	}
	return v
}

func typedValue(value, code string) any {
	switch code {
	case "i":
		if v, err := strconv.ParseInt(value, 10, 64); err == nil {
			return v
		}
	case "f":
		if v, err := strconv.ParseFloat(value, 64); err == nil {
			return v
		}
	case "b":
		return value == "true"
	}
	return value
}

// MessageFromFrame decodes a MESSAGE frame exactly as the Python SDK's from_frame does (spec/stomp.md §4
// and §7; vectors spec/vectors/messages.json).
func MessageFromFrame(f *stomp.Frame) *Message {
	h := f.Map()
	m := &Message{Body: f.Body, ContentType: h["content-type"], Headers: f.Headers,
		transformation: h["transformation"], Properties: map[string]any{}}
	m.ID = h["message-id"]
	m.Destination = h["destination"]
	persistent, ok := h["persistent"]
	m.NonPersistent = ok && strings.ToLower(persistent) == "false"
	prio, ok := h["priority"]
	m.Priority = int(intOr(prio, ok, DefaultPriority))
	ts, ok := h["timestamp"]
	m.Timestamp = intOr(ts, ok, 0)
	exp, ok := h["expires"]
	m.Expires = intOr(exp, ok, 0)
	m.CorrelationID = h["correlation-id"]
	m.ReplyTo = h["reply-to"]
	m.Type = h["type"]
	m.DedupID = h["pymq-dedup-id"]
	m.Redelivered = strings.ToLower(h["redelivered"]) == "true"
	if seq, ok := h["pymq-seq"]; ok && seq != "" && strings.Trim(seq, "0123456789") == "" {
		if v, err := strconv.ParseInt(seq, 10, 64); err == nil {
			m.Sequence, m.HasSequence = v, true
		}
	}
	types := map[string]string{}
	if spec := h["pymq-types"]; spec != "" {
		for _, item := range strings.Split(spec, ",") {
			if i := strings.LastIndexByte(item, '='); i >= 0 {
				types[item[:i]] = item[i+1:]
			} else {
				types[""] = item
			}
		}
	}
	for _, hd := range f.Headers {
		if reserved[hd.Name] {
			continue
		}
		if _, dup := m.Properties[hd.Name]; dup {
			continue
		}
		if code, ok := types[hd.Name]; ok && code != "" {
			m.Properties[hd.Name] = typedValue(hd.Value, code)
		} else {
			m.Properties[hd.Name] = hd.Value
		}
	}
	m.DeliveryCount = 1
	if count, ok := m.Properties["JMSXDeliveryCount"]; ok {
		m.DeliveryCount = int(anyInt(count, 1))
		m.Properties["JMSXDeliveryCount"] = int64(m.DeliveryCount)
	}
	if seq, ok := m.Properties["JMSXGroupSeq"].(string); ok {
		m.Properties["JMSXGroupSeq"] = intOr(seq, true, 0)
	}
	return m
}

func anyInt(v any, def int64) int64 {
	switch x := v.(type) {
	case int64:
		return x
	case string:
		return intOr(x, true, def)
	}
	return def
}

// nowMillis is the JMS timestamp clock.
func nowMillis() int64 { return time.Now().UnixMilli() }
