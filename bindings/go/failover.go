package pymq

import (
	"context"
	"crypto/tls"
	"fmt"
	"math"
	"math/rand"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Failover URLs (spec/ha.md §4.1-4.2, vectors spec/vectors/failover_urls.json): ActiveMQ's
// "failover:(stomp://a:61613,stomp://b:61613)?initialReconnectDelay=100&randomize=false", "failover:" without
// parentheses, or a plain comma list "stomp://a:61613,stomp://b:61613" name a group of brokers; Dial with one
// of them follows whichever broker of the group is live.

// Broker is one member of a group: where it is and its own credentials ("" when the URL has none).
type Broker struct {
	Host     string // without IPv6 brackets
	Port     int
	TLS      bool
	Username string
	Password string
	HasUser  bool   // the URL named a user
	HasPass  bool   // the URL named a password
	VHost    string // the URL's path: the broker's virtual host (spec/stomp.md §1); "" none
}

var vhostName = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// vhostOfPath reads a STOMP URL's path ("/shop") as the virtual host it names ("" for none or "/").
func vhostOfPath(path string) (string, error) {
	name, err := url.PathUnescape(strings.TrimPrefix(path, "/"))
	if err != nil || (name != "" && !vhostName.MatchString(name)) {
		return "", fmt.Errorf("a STOMP URL's path is a virtual host name (letters, digits, '_', '-'), not %q", path)
	}
	return name, nil
}

// Addr is host:port for net.Dial.
func (b Broker) Addr() string { return net.JoinHostPort(b.Host, strconv.Itoa(b.Port)) }

// FailoverOptions are the options of spec/ha.md §4.2, by ActiveMQ's names.
type FailoverOptions struct {
	InitialReconnectDelay       int // ms; wait before the second attempt after a loss (the first is immediate)
	MaxReconnectDelay           int // ms; the wait never grows past this
	UseExponentialBackOff       bool
	BackOffMultiplier           float64
	Jitter                      float64 // each wait is scaled by a uniform factor in [1-Jitter, 1+Jitter]
	MaxReconnectAttempts        int     // attempts after a loss before giving up; -1 forever, 0 none
	StartupMaxReconnectAttempts int     // extra passes over the list at the first connect; -1 until one answers
	Randomize                   bool    // shuffle the list before each pass
	Timeout                     int     // ms a call waits while reconnecting; -1 until the attempts are spent
	// ms one attempt may take to open its link (TCP, TLS, CONNECTED), within Options.Timeout; 0: that alone.
	// A stopped broker's port still accepts TCP connections: without it an attempt there would wait the whole
	// Options.Timeout before the next broker is tried.
	ConnectionTimeout int
}

// DefaultFailoverOptions are spec/ha.md §4.2's defaults.
var DefaultFailoverOptions = FailoverOptions{InitialReconnectDelay: 100, MaxReconnectDelay: 5000,
	UseExponentialBackOff: true, BackOffMultiplier: 2, Jitter: 0.2, MaxReconnectAttempts: -1, Timeout: -1,
	ConnectionTimeout: 3000}

// attempt bounds one attempt's dial and handshake by ConnectionTimeout (within ctx's own deadline).
func (o FailoverOptions) attempt(ctx context.Context) (context.Context, context.CancelFunc) {
	if o.ConnectionTimeout <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, time.Duration(o.ConnectionTimeout)*time.Millisecond)
}

// DelayBefore is the wait (before jitter) before attempt n (from 1) after a loss: 0 for the first, then the
// initial delay times the multiplier to the power n-2 (just the initial delay without exponential back-off),
// never more than the maximum.
func (o FailoverOptions) DelayBefore(n int) time.Duration {
	if n <= 1 {
		return 0
	}
	d := float64(o.InitialReconnectDelay)
	if o.UseExponentialBackOff {
		d *= math.Pow(o.BackOffMultiplier, float64(n-2))
	}
	d = math.Min(d, float64(o.MaxReconnectDelay))
	return time.Duration(d * float64(time.Millisecond))
}

func (o FailoverOptions) jittered(n int, r *rand.Rand) time.Duration {
	d := float64(o.DelayBefore(n)) * (1 - o.Jitter + 2*o.Jitter*r.Float64())
	return time.Duration(math.Min(d, float64(o.MaxReconnectDelay)*float64(time.Millisecond)))
}

// BrokerGroup is a broker URL read as a group: its members in the URL's order, the failover options, and
// whether a lost connection is replaced (false for a single URL).
type BrokerGroup struct {
	Brokers  []Broker
	Options  FailoverOptions
	Failover bool
}

// URLError is a broker URL refused when it is read; Kind is one of empty, unbalanced, unknown-option,
// duplicate-option, bad-value, vm-in-group, nested-failover, bad-broker-url.  It never holds a password.
type URLError struct {
	Kind string
	Msg  string
}

func (e *URLError) Error() string { return "pymq: bad broker URL (" + e.Kind + "): " + e.Msg }

func refuse(kind, format string, a ...any) error {
	return &URLError{Kind: kind, Msg: fmt.Sprintf(format, a...)}
}

var passwordInURL = regexp.MustCompile(`(://[^:/@,()?]*:)[^@,()?/]*@`)

func redacted(u string) string { return passwordInURL.ReplaceAllString(u, "$1***@") }

var (
	wholeText   = regexp.MustCompile(`^-?[0-9]+$`)
	decimalText = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)
)

// ParseBrokerURL reads a broker URL: one broker, or a group (spec/ha.md §4.1).
func ParseBrokerURL(raw string) (*BrokerGroup, error) {
	text := strings.TrimSpace(raw)
	if len(text) >= 9 && strings.EqualFold(text[:9], "failover:") {
		rest := strings.TrimLeft(text[9:], " \t")
		if strings.HasPrefix(rest, "(") {
			closing := strings.LastIndex(rest, ")")
			if closing < 0 {
				return nil, refuse("unbalanced", "no ')' closes the broker list of %s", redacted(raw))
			}
			inner, tail := rest[1:closing], strings.TrimSpace(rest[closing+1:])
			if tail != "" && !strings.HasPrefix(tail, "?") {
				return nil, refuse("unbalanced", "unexpected text after the broker list of %s; options follow a '?'", redacted(raw))
			}
			opts := DefaultFailoverOptions
			if tail != "" {
				var err error
				if opts, err = parseFailoverOptions(raw, tail[1:]); err != nil {
					return nil, err
				}
			}
			brokers, err := members(raw, inner)
			if err != nil {
				return nil, err
			}
			return &BrokerGroup{Brokers: brokers, Options: opts, Failover: true}, nil
		}
		brokers, err := members(raw, rest)
		if err != nil {
			return nil, err
		}
		return &BrokerGroup{Brokers: brokers, Options: DefaultFailoverOptions, Failover: true}, nil
	}
	if strings.Contains(text, ",") {
		brokers, err := members(raw, text)
		if err != nil {
			return nil, err
		}
		return &BrokerGroup{Brokers: brokers, Options: DefaultFailoverOptions, Failover: true}, nil
	}
	if text == "" {
		return nil, refuse("empty", "the broker URL is empty")
	}
	b, err := parseMember(text)
	if err != nil {
		return nil, refuse("bad-broker-url", "%v", err)
	}
	return &BrokerGroup{Brokers: []Broker{b}, Options: DefaultFailoverOptions}, nil
}

func members(raw, inner string) ([]Broker, error) {
	if strings.ContainsAny(inner, "()") {
		return nil, refuse("unbalanced", "parentheses inside the broker list of %s (percent-encode them inside a URL)", redacted(raw))
	}
	parts := strings.Split(inner, ",")
	if len(parts) == 1 && strings.TrimSpace(parts[0]) == "" {
		return nil, refuse("empty", "no broker URL in %s", redacted(raw))
	}
	out := make([]Broker, 0, len(parts))
	for _, p := range parts {
		p = strings.TrimSpace(p)
		lower := strings.ToLower(p)
		switch {
		case p == "":
			return nil, refuse("empty", "an empty broker URL in the list of %s", redacted(raw))
		case strings.HasPrefix(lower, "failover:"):
			return nil, refuse("nested-failover", "a failover URL inside the group %s", redacted(raw))
		case strings.HasPrefix(lower, "vm:"):
			return nil, refuse("vm-in-group", "vm:// cannot be part of a group of brokers (%s)", redacted(raw))
		}
		b, err := parseMember(p)
		if err != nil {
			return nil, refuse("bad-broker-url", "in the group %s: %v", redacted(raw), err)
		}
		out = append(out, b)
	}
	return out, nil
}

// parseMember reads one complete broker URL: stomp:// or tcp://, stomp+ssl:// (stomps://, ssl://, tls://).
func parseMember(raw string) (Broker, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return Broker{}, fmt.Errorf("not a URL: %s", redacted(raw))
	}
	var b Broker
	switch strings.ToLower(u.Scheme) {
	case "stomp", "tcp":
	case "stomp+ssl", "stomp+tls", "stomps", "ssl", "tls":
		b.TLS = true
	default:
		return Broker{}, fmt.Errorf("unsupported URL %s: use stomp://host:port or stomp+ssl://host:port", redacted(raw))
	}
	if u.Opaque != "" {
		return Broker{}, fmt.Errorf("not a broker URL: %s", redacted(raw))
	}
	if b.VHost, err = vhostOfPath(u.EscapedPath()); err != nil {
		return Broker{}, fmt.Errorf("%w: %s", err, redacted(raw))
	}
	if u.RawQuery != "" {
		return Broker{}, fmt.Errorf("the Go client has no URL options (%s): use Options", redacted(raw))
	}
	b.Host = u.Hostname()
	if b.Host == "" {
		b.Host = "127.0.0.1"
	}
	b.Port = 61613
	if b.TLS {
		b.Port = 61614
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return Broker{}, fmt.Errorf("port %q out of range in %s", p, redacted(raw))
		}
		b.Port = n
	}
	if u.User != nil {
		b.Username, b.HasUser = u.User.Username(), true
		b.Password, b.HasPass = u.User.Password()
	}
	return b, nil
}

func parseFailoverOptions(raw, query string) (FailoverOptions, error) {
	o := DefaultFailoverOptions
	seen := map[string]bool{}
	for _, pair := range strings.Split(query, "&") {
		k, v, ok := strings.Cut(pair, "=")
		key, err1 := url.QueryUnescape(k)
		value, err2 := url.QueryUnescape(v)
		if err1 != nil || err2 != nil {
			return o, refuse("bad-value", "bad percent-encoding in the options of %s", redacted(raw))
		}
		if !ok {
			return o, refuse("bad-value", "failover option %q without a value in %s", key, redacted(raw))
		}
		whole := func(min int) (int, error) {
			if wholeText.MatchString(value) && len(value) <= 12 {
				if n, err := strconv.ParseInt(value, 10, 64); err == nil && n >= int64(min) && n <= math.MaxInt32 {
					return int(n), nil
				}
			}
			return 0, refuse("bad-value", "%s=%q in %s: expected a whole number from %d to %d", key, value, redacted(raw), min, math.MaxInt32)
		}
		decimal := func(min, max float64) (float64, error) {
			if decimalText.MatchString(value) {
				if f, err := strconv.ParseFloat(value, 64); err == nil && f >= min && f <= max {
					return f, nil
				}
			}
			return 0, refuse("bad-value", "%s=%q in %s: expected a decimal number from %g to %g", key, value, redacted(raw), min, max)
		}
		boolean := func() (bool, error) {
			switch strings.ToLower(value) {
			case "true":
				return true, nil
			case "false":
				return false, nil
			}
			return false, refuse("bad-value", "%s=%q in %s: expected true or false", key, value, redacted(raw))
		}
		var err error
		switch key {
		case "initialReconnectDelay":
			o.InitialReconnectDelay, err = whole(0)
		case "maxReconnectDelay":
			o.MaxReconnectDelay, err = whole(0)
		case "useExponentialBackOff":
			o.UseExponentialBackOff, err = boolean()
		case "backOffMultiplier":
			o.BackOffMultiplier, err = decimal(1, 1000)
		case "jitter":
			o.Jitter, err = decimal(0, 1)
		case "maxReconnectAttempts":
			o.MaxReconnectAttempts, err = whole(-1)
		case "startupMaxReconnectAttempts":
			o.StartupMaxReconnectAttempts, err = whole(-1)
		case "randomize":
			o.Randomize, err = boolean()
		case "timeout":
			o.Timeout, err = whole(-1)
		case "connectionTimeout":
			o.ConnectionTimeout, err = whole(0)
		default:
			return o, refuse("unknown-option", "unknown failover option %q in %s (spec/ha.md section 4.2)", key, redacted(raw))
		}
		if err != nil {
			return o, err
		}
		if seen[key] {
			return o, refuse("duplicate-option", "failover option %q given twice in %s", key, redacted(raw))
		}
		seen[key] = true
	}
	return o, nil
}

// picker dials the members of a group in turn (shuffled per pass when asked), one attempt per call; it
// remembers the member it reached so the handshake uses that member's credentials.
type picker struct {
	group  *BrokerGroup
	tlsCfg *tls.Config
	mu     sync.Mutex
	order  []int
	next   int
	last   int // the member of the last dial
	rnd    *rand.Rand
}

func newPicker(g *BrokerGroup, cfg *tls.Config) *picker {
	return &picker{group: g, tlsCfg: cfg, rnd: rand.New(rand.NewSource(time.Now().UnixNano())), last: -1}
}

// pass starts a pass over the list, after member `after` (-1: from the first).
func (p *picker) pass(after int) {
	n := len(p.group.Brokers)
	p.order = p.order[:0]
	for k := 1; k <= n; k++ {
		p.order = append(p.order, ((after+k)%n+n)%n)
	}
	if p.group.Options.Randomize {
		p.rnd.Shuffle(n, func(i, j int) { p.order[i], p.order[j] = p.order[j], p.order[i] })
	}
	p.next = 0
}

// dial tries the next member: one attempt.
func (p *picker) dial(ctx context.Context) (net.Conn, error) {
	p.mu.Lock()
	if p.next >= len(p.order) {
		p.pass(p.last)
	}
	i := p.order[p.next]
	p.next++
	p.last = i
	b := p.group.Brokers[i]
	p.mu.Unlock()
	var d net.Dialer
	nc, err := d.DialContext(ctx, "tcp", b.Addr())
	if err != nil {
		return nil, fmt.Errorf("pymq: cannot connect to %s: %w", b.Addr(), err)
	}
	if !b.TLS && p.tlsCfg == nil {
		return nc, nil
	}
	cfg := &tls.Config{}
	if p.tlsCfg != nil {
		cfg = p.tlsCfg.Clone()
	}
	if cfg.ServerName == "" {
		cfg.ServerName = b.Host
	}
	tc := tls.Client(nc, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		nc.Close()
		return nil, fmt.Errorf("pymq: TLS handshake with %s: %w", b.Addr(), err)
	}
	return tc, nil
}

// credentials of the member reached last, unless the application gave its own.
// vhost is the virtual host a link to the member dialed last enters (opts.VHostAt).
func (p *picker) vhost(opts Options) string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.last < 0 {
		return opts.VHost
	}
	return opts.VHostAt(p.group.Brokers[p.last])
}

// VHostAt is the virtual host a connection with these options enters at broker b (spec/stomp.md §1,
// vectors spec/vectors/failover_urls.json "vhosts"): b's own URL path, else VHost, else "" (the
// broker's default vhost "/").
func (o Options) VHostAt(b Broker) string {
	if b.VHost != "" {
		return b.VHost
	}
	return o.VHost
}

func (p *picker) credentials(opts Options) (string, string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if opts.Login != "" || p.last < 0 {
		return opts.Login, opts.Passcode
	}
	b := p.group.Brokers[p.last]
	if b.HasUser {
		return b.Username, b.Password
	}
	return opts.Login, opts.Passcode
}
