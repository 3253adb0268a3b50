package pymq

import (
	"errors"
	"strings"

	"github.com/pymq/pymq/bindings/go/stomp"
)

var (
	// ErrClosed is returned by operations on a connection closed by Close.
	ErrClosed = errors.New("pymq: connection closed")
	// ErrDisconnected wraps every error caused by losing the connection to the broker: a request in flight
	// when it was lost (a Send whose receipt never came: the message may or may not have reached the
	// broker), or the final error when reconnecting is off or gave up.
	ErrDisconnected = errors.New("pymq: disconnected from the broker")
	// ErrStaleMessage is returned by Ack and Nack for a message that came on a connection that has since
	// been replaced by a reconnect: the broker already took it back and redelivers it.
	ErrStaleMessage = errors.New("pymq: the message came on an earlier connection; the broker redelivers it")
	// ErrTxLost is returned by Commit of a transaction that had done something on a connection that has
	// since been replaced: the broker aborted it when that connection ended (JMS's
	// TransactionRolledBackException).
	ErrTxLost = errors.New("pymq: the transaction's connection was lost; the broker aborted it")
	// ErrTxInDoubt is returned by a Commit whose RECEIPT was lost with the connection: the broker applied
	// the transaction whole or not at all, and which is not known; it is never sent again.
	ErrTxInDoubt = errors.New("pymq: the connection was lost before the COMMIT's receipt; the outcome is unknown")
	// ErrHeartBeat is the cause of a connection declared dead because the broker went silent.
	ErrHeartBeat = errors.New("pymq: no heart-beat from the broker")
)

// disconnected is ErrDisconnected with its cause: errors.Is finds both (ErrDisconnected, and for example
// ErrHeartBeat or an i/o error below it).
type disconnected struct{ cause error }

func (e *disconnected) Error() string        { return ErrDisconnected.Error() + ": " + e.cause.Error() }
func (e *disconnected) Is(target error) bool { return target == ErrDisconnected }
func (e *disconnected) Unwrap() error        { return e.cause }

func disconnectedBy(cause error) error {
	if errors.Is(cause, ErrDisconnected) {
		return cause
	}
	return &disconnected{cause}
}

// ServerError is an ERROR frame from the broker (spec/stomp.md §6).  The broker closes the connection
// after every ERROR, and the client does not reconnect after one (it would meet the same refusal).
type ServerError struct {
	Code    string            // pymq-code, e.g. "invalid-destination"
	Message string            // the message header: a human sentence
	Fields  map[string]string // pymq-field-* headers without the prefix
	Body    string
}

func (e *ServerError) Error() string {
	if e.Code == "" {
		return "pymq: broker error: " + e.Message
	}
	return "pymq: " + e.Code + ": " + e.Message
}

func serverError(f *stomp.Frame) *ServerError {
	e := &ServerError{Code: f.Value("pymq-code"), Message: f.Value("message"), Fields: map[string]string{},
		Body: string(f.Body)}
	for _, h := range f.Headers {
		if strings.HasPrefix(h.Name, "pymq-field-") {
			e.Fields[strings.TrimPrefix(h.Name, "pymq-field-")] = h.Value
		}
	}
	return e
}
