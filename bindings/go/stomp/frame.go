// Package stomp is pymq's STOMP 1.0/1.1/1.2 frame codec for Go: a sans-IO Scanner that takes bytes in any
// split and returns whole frames, and Encode, which writes one frame.
//
// The rules are spec/stomp.md §2 and the vectors are spec/vectors/frames.json, shared with the Python
// reference (pymq/protocol/_scanner_py.py): EOLs between frames are heart-beats; lines end in LF or CRLF;
// a header splits at its first colon and is never trimmed; the first of a repeated header wins; from 1.1
// on names and values are unescaped (\r \n \c \\, anything else is a bad-escape error) except in CONNECT,
// STOMP and CONNECTED; a body is content-length bytes followed by NUL, or runs to the first NUL.
// The package does no I/O and keeps no state besides one Scanner's buffer.
package stomp

import (
	"fmt"
	"strconv"
	"strings"
)

// Versions of STOMP, as they appear in accept-version and version headers.
const (
	V10 = "1.0"
	V11 = "1.1"
	V12 = "1.2"
)

// Header is one name:value pair.  Frames keep headers as a list so order and repeats survive.
type Header struct {
	Name, Value string
}

// Frame is one STOMP frame.  Headers holds each name once (the first occurrence) in arrival order.
type Frame struct {
	Command string
	Headers []Header
	Body    []byte
}

// Get returns the value of the named header and whether it is present.
func (f *Frame) Get(name string) (string, bool) {
	for _, h := range f.Headers {
		if h.Name == name {
			return h.Value, true
		}
	}
	return "", false
}

// Value returns the named header's value, or "" when it is absent.
func (f *Frame) Value(name string) string {
	v, _ := f.Get(name)
	return v
}

// Map returns the headers as a map (each name once, the first value).
func (f *Frame) Map() map[string]string {
	m := make(map[string]string, len(f.Headers))
	for _, h := range f.Headers {
		if _, dup := m[h.Name]; !dup {
			m[h.Name] = h.Value
		}
	}
	return m
}

// Wire error codes of spec/stomp.md §6 that the codec raises.
const (
	CodeMalformedFrame = "malformed-frame"
	CodeBadEscape      = "bad-escape"
	CodeFrameTooLarge  = "frame-too-large"
	CodeInvalidHeader  = "invalid-header"
)

// Error is a framing error: Code is the pymq-code of spec/stomp.md §6 (the Python class in parentheses:
// malformed-frame MalformedFrame, bad-escape BadEscape, frame-too-large FrameTooLarge, invalid-header
// InvalidHeader).  For frame-too-large, Size and Limit say by how much.
type Error struct {
	Code    string
	Message string
	Size    int
	Limit   int
}

func (e *Error) Error() string { return e.Message }

func errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

func tooLarge(size, limit int) *Error {
	return &Error{Code: CodeFrameTooLarge, Size: size, Limit: limit,
		Message: fmt.Sprintf("frame of %d bytes exceeds the limit of %d bytes", size, limit)}
}

// unescapedCommand reports frames whose headers are never escaped (the 1.2 rule, kept for every version).
func unescapedCommand(command string) bool {
	return command == "CONNECT" || command == "STOMP" || command == "CONNECTED"
}

var escaper = strings.NewReplacer("\\", "\\\\", "\n", "\\n", ":", "\\c", "\r", "\\r")

// STOMP 1.1 has no \r escape: a CR travels raw (spec/stomp.md §2).
var escaper11 = strings.NewReplacer("\\", "\\\\", "\n", "\\n", ":", "\\c")

// Escape applies STOMP 1.2 header escaping.
func Escape(s string) string { return escaper.Replace(s) }

// EscapeFor applies the header escaping of a version: 1.2 escapes CR, 1.1 sends it raw.
func EscapeFor(s, version string) string {
	if version == "1.1" {
		return escaper11.Replace(s)
	}
	return escaper.Replace(s)
}

// Unescape undoes Escape; an undefined escape or a lone trailing backslash is a bad-escape Error.
func Unescape(s string) (string, error) {
	if !strings.Contains(s, "\\") {
		return s, nil
	}
	var b strings.Builder
	b.Grow(len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		if i+1 >= len(s) {
			return "", errorf(CodeBadEscape, "header ends with a lone backslash")
		}
		i++
		switch s[i] {
		case 'r':
			b.WriteByte('\r')
		case 'n':
			b.WriteByte('\n')
		case 'c':
			b.WriteByte(':')
		case '\\':
			b.WriteByte('\\')
		default:
			return "", errorf(CodeBadEscape, "undefined escape sequence '\\%c' in header", s[i])
		}
	}
	return b.String(), nil
}

// Encode writes one frame.  A content-length header in headers is ignored and one is added whenever
// the body is not empty.  With version 1.0, and for CONNECT/STOMP/CONNECTED, headers go unescaped; a
// name or value that cannot be written that way (a LF, or a ':' in a name) is an invalid-header Error
// rather than a corrupted stream.
func Encode(command string, headers []Header, body []byte, version string) ([]byte, error) {
	raw := version == V10 || unescapedCommand(command)
	var b strings.Builder
	b.WriteString(command)
	b.WriteByte('\n')
	for _, h := range headers {
		if h.Name == "content-length" {
			continue
		}
		if raw {
			if strings.Contains(h.Name, "\n") || strings.Contains(h.Value, "\n") || strings.Contains(h.Name, ":") {
				return nil, errorf(CodeInvalidHeader, "header %q cannot be sent unescaped in a %s frame (STOMP %s)",
					h.Name, command, version)
			}
			b.WriteString(h.Name)
			b.WriteByte(':')
			b.WriteString(h.Value)
		} else {
			b.WriteString(EscapeFor(h.Name, version))
			b.WriteByte(':')
			b.WriteString(EscapeFor(h.Value, version))
		}
		b.WriteByte('\n')
	}
	if len(body) > 0 {
		b.WriteString("content-length:")
		b.WriteString(strconv.Itoa(len(body)))
		b.WriteByte('\n')
	}
	b.WriteByte('\n')
	out := make([]byte, 0, b.Len()+len(body)+1)
	out = append(out, b.String()...)
	out = append(out, body...)
	return append(out, 0), nil
}
