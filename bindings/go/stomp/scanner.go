package stomp

import (
	"bytes"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Defaults of the broker's limits (spec/stomp.md §2).
const (
	DefaultMaxFrameSize = 4 * 1024 * 1024
	DefaultMaxHeaders   = 1000
)

// Scanner is an incremental STOMP frame parser.  Feed it bytes as they arrive, in any split; it returns
// the complete frames found so far and keeps at most one partial frame.  After an error it stays
// failed (its connection is about to close).
//
// Feed returns right after a CONNECT, STOMP or CONNECTED frame and keeps later bytes buffered: they must
// be parsed with the version that frame negotiates.  Set Version, then call Feed(nil) to go on.
type Scanner struct {
	MaxFrameSize int
	MaxHeaders   int
	// Version drives unescaping: "1.0" does none.  The connection sets it once CONNECTED settles it.
	Version string

	buf    []byte
	pos    int // start of the frame being scanned; bytes before it are consumed
	scan   int // where to resume looking for the header end or the NUL (no rescans)
	failed error
	// a frame whose headers are parsed but whose body has not fully arrived
	pending *pendingFrame
}

type pendingFrame struct {
	command   string
	headers   []Header
	length    int // content-length, or -1
	bodyStart int // relative to pos
}

// NewScanner returns a Scanner with the default limits for the given version.
func NewScanner(version string) *Scanner {
	return &Scanner{MaxFrameSize: DefaultMaxFrameSize, MaxHeaders: DefaultMaxHeaders, Version: version}
}

// Buffered is the number of bytes held for a frame that has not completed yet.
func (s *Scanner) Buffered() int { return len(s.buf) - s.pos }

// Feed adds data and returns the frames it completes.
func (s *Scanner) Feed(data []byte) ([]Frame, error) {
	if s.failed != nil {
		return nil, s.failed
	}
	s.buf = append(s.buf, data...)
	var frames []Frame
	for {
		f, err := s.next()
		if err != nil {
			s.failed = err
			s.buf, s.pos, s.scan, s.pending = nil, 0, 0, nil
			return frames, err
		}
		if f == nil {
			break
		}
		frames = append(frames, *f)
		if unescapedCommand(f.Command) {
			break // what follows waits for the version this frame negotiates
		}
	}
	if s.pos > 0 {
		// compact once per Feed, not once per frame: many small frames per read stay linear
		n := copy(s.buf, s.buf[s.pos:])
		s.buf = s.buf[:n]
		s.scan -= s.pos
		s.pos = 0
	}
	return frames, nil
}

func (s *Scanner) next() (*Frame, error) {
	buf := s.buf
	limit := s.MaxFrameSize
	n := len(buf)
	p := s.pos
	if s.pending == nil {
		for p < n && (buf[p] == '\n' || buf[p] == '\r') { // heart-beats
			if buf[p] == '\r' {
				if p+1 >= n {
					break // a CR whose LF has not arrived yet
				}
				if buf[p+1] != '\n' {
					return nil, errorf(CodeMalformedFrame, "stray CR before a command")
				}
			}
			p++
		}
		s.pos = p
		if s.scan < p {
			s.scan = p
		}
		if p >= n || buf[p] == '\r' {
			return nil, nil
		}
		headLen, bodyStart := s.headerEnd(p)
		if headLen < 0 {
			if n-p > limit {
				return nil, tooLarge(n-p, limit)
			}
			return nil, nil
		}
		if bodyStart > limit {
			return nil, tooLarge(bodyStart, limit)
		}
		command, headers, length, err := s.parseHead(buf[p : p+headLen])
		if err != nil {
			return nil, err
		}
		s.pending = &pendingFrame{command, headers, length, bodyStart}
		s.scan = p + bodyStart
	}
	pf := s.pending
	b := p + pf.bodyStart
	var end int
	if pf.length >= 0 {
		if pf.length > limit-pf.bodyStart {
			size := pf.bodyStart + pf.length
			if pf.length > math.MaxInt-pf.bodyStart {
				size = math.MaxInt
			}
			return nil, tooLarge(size, limit)
		}
		if n < b+pf.length+1 {
			return nil, nil
		}
		if buf[b+pf.length] != 0 {
			return nil, errorf(CodeMalformedFrame, "%s frame: expected NUL after %d body bytes (content-length)",
				pf.command, pf.length)
		}
		end = b + pf.length
	} else {
		i := bytes.IndexByte(buf[s.scan:], 0)
		if i < 0 {
			if n-p > limit {
				return nil, tooLarge(n-p, limit)
			}
			s.scan = n
			return nil, nil
		}
		end = s.scan + i
		if end-p > limit {
			return nil, tooLarge(end-p, limit)
		}
	}
	body := make([]byte, end-b)
	copy(body, buf[b:end])
	s.pos, s.scan = end+1, end+1
	s.pending = nil
	return &Frame{Command: pf.command, Headers: pf.headers, Body: body}, nil
}

// headerEnd returns the length of the command and header text and the offset of the body, both relative
// to p, or (-1, -1) while the blank line has not arrived.  It resumes where the last search stopped.
func (s *Scanner) headerEnd(p int) (int, int) {
	buf := s.buf
	n := len(buf)
	from := s.scan - 2
	if from < p {
		from = p
	}
	for {
		j := bytes.IndexByte(buf[from:], '\n')
		if j < 0 {
			break
		}
		i := from + j
		if i+1 >= n {
			break
		}
		switch buf[i+1] {
		case '\n':
			return i - p, i + 2 - p
		case '\r':
			if i+2 >= n {
				s.scan = maxInt(n-2, p)
				return -1, -1
			}
			if buf[i+2] == '\n' {
				return i - p, i + 3 - p
			}
		}
		from = i + 1
	}
	s.scan = maxInt(n-2, p)
	return -1, -1
}

func maxInt(a, b int) int {
	if a > b {
		return a
	}
	return b
}

func (s *Scanner) parseHead(head []byte) (string, []Header, int, error) {
	if bytes.IndexByte(head, 0) >= 0 {
		return "", nil, 0, errorf(CodeMalformedFrame, "NUL inside the header block")
	}
	if !utf8.Valid(head) {
		return "", nil, 0, errorf(CodeMalformedFrame, "frame header is not valid UTF-8")
	}
	lines := strings.Split(string(head), "\n")
	command := strings.TrimSuffix(lines[0], "\r")
	if command == "" {
		return "", nil, 0, errorf(CodeMalformedFrame, "empty command line")
	}
	escaped := s.Version != V10 && !unescapedCommand(command)
	if len(lines)-1 > s.MaxHeaders {
		return "", nil, 0, errorf(CodeMalformedFrame, "%s frame has %d headers, more than the limit of %d",
			command, len(lines)-1, s.MaxHeaders)
	}
	headers := make([]Header, 0, len(lines)-1)
	seen := make(map[string]struct{}, len(lines)-1)
	for _, line := range lines[1:] {
		line = strings.TrimSuffix(line, "\r")
		colon := strings.IndexByte(line, ':')
		if colon < 0 {
			return "", nil, 0, errorf(CodeMalformedFrame, "%s frame: header line without ':'", command)
		}
		if colon == 0 {
			return "", nil, 0, errorf(CodeMalformedFrame, "%s frame: header with an empty name", command)
		}
		name, value := line[:colon], line[colon+1:]
		if escaped {
			var err error
			if name, err = Unescape(name); err != nil {
				return "", nil, 0, err
			}
			if value, err = Unescape(value); err != nil {
				return "", nil, 0, err
			}
		}
		if _, dup := seen[name]; dup {
			continue
		}
		seen[name] = struct{}{}
		headers = append(headers, Header{name, value})
	}
	length := -1
	for _, h := range headers {
		if h.Name != "content-length" {
			continue
		}
		if h.Value == "" || strings.TrimLeft(h.Value, "0123456789") != "" {
			return "", nil, 0, errorf(CodeInvalidHeader, "%s frame: content-length %q is not a non-negative integer",
				command, h.Value)
		}
		v, err := strconv.Atoi(h.Value)
		if err != nil { // more digits than an int holds: certainly over any limit
			v = math.MaxInt
		}
		length = v
	}
	return command, headers, length, nil
}
