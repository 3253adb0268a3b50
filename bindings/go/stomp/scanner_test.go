package stomp

import (
	"encoding/hex"
	"errors"
	"math/rand"
	"reflect"
	"strings"
	"testing"

	"github.com/pymq/pymq/bindings/go/internal/vectors"
)

// classCodes maps the Python error classes named by the vectors to the wire codes this package uses.
var classCodes = map[string]string{
	"MalformedFrame": CodeMalformedFrame,
	"BadEscape":      CodeBadEscape,
	"FrameTooLarge":  CodeFrameTooLarge,
	"InvalidHeader":  CodeInvalidHeader,
}

type vectorFrame struct {
	Command string      `json:"command"`
	Headers [][2]string `json:"headers"`
	BodyHex string      `json:"body_hex"`
}

type vectorError struct {
	Class    string `json:"class"`
	Contains string `json:"contains"`
}

type parseCase struct {
	Name         string        `json:"name"`
	Version      string        `json:"version"`
	InputHex     string        `json:"input_hex"`
	MaxFrameSize int           `json:"max_frame_size"`
	MaxHeaders   int           `json:"max_headers"`
	Frames       []vectorFrame `json:"frames"`
	Buffered     *int          `json:"buffered"`
	Error        *vectorError  `json:"error"`
}

type encodeCase struct {
	Name     string       `json:"name"`
	Version  string       `json:"version"`
	Command  string       `json:"command"`
	Headers  [][2]string  `json:"headers"`
	BodyHex  string       `json:"body_hex"`
	BytesHex string       `json:"bytes_hex"`
	Error    *vectorError `json:"error"`
}

type frameVectors struct {
	Parse  []parseCase  `json:"parse"`
	Encode []encodeCase `json:"encode"`
}

func loadFrames(t *testing.T) frameVectors {
	t.Helper()
	var v frameVectors
	if err := vectors.Load("frames.json", &v); err != nil {
		t.Fatal(err)
	}
	if len(v.Parse) == 0 || len(v.Encode) == 0 {
		t.Fatal("frames.json holds no vectors")
	}
	return v
}

// splits returns chunk sizes: none (whole), all ones (byte by byte) or random sizes from a fixed seed.
func splits(n int, mode string, seed int64) []int {
	switch mode {
	case "whole":
		return nil
	case "bytewise":
		out := make([]int, n)
		for i := range out {
			out[i] = 1
		}
		return out
	}
	rnd := rand.New(rand.NewSource(seed))
	var out []int
	for left := n; left > 0; {
		k := 1 + rnd.Intn(left)
		out = append(out, k)
		left -= k
	}
	return out
}

// feedAll feeds data in chunks and drains what a negotiating frame kept back, as a connection does.
func feedAll(s *Scanner, data []byte, chunks []int) ([]Frame, error) {
	var out []Frame
	pos := 0
	for _, size := range chunks {
		got, err := s.Feed(data[pos : pos+size])
		out = append(out, got...)
		if err != nil {
			return out, err
		}
		pos += size
	}
	got, err := s.Feed(data[pos:])
	out = append(out, got...)
	for err == nil {
		more, e := s.Feed(nil)
		if len(more) == 0 {
			return out, e
		}
		out = append(out, more...)
		err = e
	}
	return out, err
}

func mustHex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseVectors(t *testing.T) {
	for _, c := range loadFrames(t).Parse {
		c := c
		data := mustHex(t, c.InputHex)
		for i, mode := range []string{"whole", "bytewise", "random", "random", "random"} {
			t.Run(c.Name+"/"+mode, func(t *testing.T) {
				s := NewScanner(c.Version)
				if c.MaxFrameSize > 0 {
					s.MaxFrameSize = c.MaxFrameSize
				}
				if c.MaxHeaders > 0 {
					s.MaxHeaders = c.MaxHeaders
				}
				frames, err := feedAll(s, data, splits(len(data), mode, int64(i)))
				if c.Error != nil {
					var fe *Error
					if !errors.As(err, &fe) {
						t.Fatalf("want a %s error, got frames %v and error %v", c.Error.Class, frames, err)
					}
					if fe.Code != classCodes[c.Error.Class] || !strings.Contains(fe.Message, c.Error.Contains) {
						t.Fatalf("want %s containing %q, got %s: %s", c.Error.Class, c.Error.Contains, fe.Code, fe.Message)
					}
					if _, again := s.Feed([]byte("SEND\n\n\x00")); again == nil {
						t.Fatal("a failed scanner must stay failed")
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				want := make([]Frame, 0, len(c.Frames))
				for _, vf := range c.Frames {
					f := Frame{Command: vf.Command, Headers: []Header{}, Body: mustHex(t, vf.BodyHex)}
					for _, h := range vf.Headers {
						f.Headers = append(f.Headers, Header{h[0], h[1]})
					}
					want = append(want, f)
				}
				if len(frames) == 0 {
					frames = []Frame{}
				}
				if !reflect.DeepEqual(frames, want) {
					t.Fatalf("got %+v\nwant %+v", frames, want)
				}
				if c.Buffered != nil && s.Buffered() != *c.Buffered {
					t.Fatalf("buffered %d, want %d", s.Buffered(), *c.Buffered)
				}
			})
		}
	}
}

func TestEncodeVectors(t *testing.T) {
	for _, c := range loadFrames(t).Encode {
		c := c
		t.Run(c.Name, func(t *testing.T) {
			headers := make([]Header, 0, len(c.Headers))
			for _, h := range c.Headers {
				headers = append(headers, Header{h[0], h[1]})
			}
			got, err := Encode(c.Command, headers, mustHex(t, c.BodyHex), c.Version)
			if c.Error != nil {
				var fe *Error
				if !errors.As(err, &fe) || fe.Code != classCodes[c.Error.Class] || !strings.Contains(fe.Message, c.Error.Contains) {
					t.Fatalf("want %s containing %q, got %v", c.Error.Class, c.Error.Contains, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if hex.EncodeToString(got) != c.BytesHex {
				t.Fatalf("got %x\nwant %s", got, c.BytesHex)
			}
		})
	}
}

func TestPausesAfterConnectUntilFedAgain(t *testing.T) {
	s := NewScanner(V10)
	first, err := s.Feed([]byte("CONNECT\naccept-version:1.2\n\n\x00SEND\ndestination:/q\nk:a\\cb\n\n\x00"))
	if err != nil || len(first) != 1 || first[0].Command != "CONNECT" {
		t.Fatalf("got %v %v", first, err)
	}
	s.Version = V12
	rest, err := s.Feed(nil)
	if err != nil || len(rest) != 1 || rest[0].Value("k") != "a:b" {
		t.Fatalf("got %v %v", rest, err)
	}
}

func TestRoundTripsThroughEncode(t *testing.T) {
	body := make([]byte, 1<<20)
	for i := range body {
		body[i] = byte(i)
	}
	headers := []Header{{"destination", "/queue/a:b"}, {"k\nx", "v:\\\r\n"}}
	data, err := Encode("SEND", headers, body, V12)
	if err != nil {
		t.Fatal(err)
	}
	s := NewScanner(V12)
	var frames []Frame
	for i := 0; i < len(data); i += 7001 {
		end := i + 7001
		if end > len(data) {
			end = len(data)
		}
		got, err := s.Feed(data[i:end])
		if err != nil {
			t.Fatal(err)
		}
		frames = append(frames, got...)
	}
	if len(frames) != 1 || !reflect.DeepEqual(frames[0].Headers[:2], headers) || string(frames[0].Body) != string(body) {
		t.Fatalf("round trip changed the frame: %v", frames[0].Headers)
	}
	if s.Buffered() != 0 {
		t.Fatalf("%d bytes left over", s.Buffered())
	}
}

func TestManySmallFramesInOneFeed(t *testing.T) {
	one, _ := Encode("SEND", []Header{{"destination", "/queue/a"}}, []byte("xxxxxxxxxx"), V12)
	var data []byte
	for i := 0; i < 5000; i++ {
		data = append(data, one...)
	}
	data = append(data, one[:7]...)
	frames, err := NewScanner(V12).Feed(data)
	if err != nil || len(frames) != 5000 {
		t.Fatalf("%d frames, %v", len(frames), err)
	}
}
