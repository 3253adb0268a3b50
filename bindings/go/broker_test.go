package pymq_test

// The integration tests run against a real pymq-server that TestMain starts on a free port with a
// private data directory:
//
//	PYMQ_BROKER_ADDR  use a broker that is already running (host:port) instead
//	PYMQ_SERVER       the command that runs the broker (default: pymq-server from PATH), for example
//	                  "python3 -m pymq_server"; it gets --host 127.0.0.1 --port 0 --data-dir <tmp>
//
// Tests that restart a broker or configure one (reconnect, heart-beats) start their own with the same
// command.  Without a broker the integration tests skip, except when CI is set, where they fail.

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

var (
	brokerAddr   string
	brokerReason string // why there is no broker
)

var (
	listening = regexp.MustCompile(`pymq-server listening on (\S+:\d+)`)
	// the broker's other listeners, announced after the first line: tls (host:port), websocket (a URL)
	otherListener = regexp.MustCompile(`pymq-server (tls|websocket) listening on (\S+)`)
	// a member of a live/backup group (spec/ha.md) that waits for the store: it listens once it takes over
	backupLine = regexp.MustCompile(`pymq-server backup of node \S+ waiting`)
)

// testBroker is one pymq-server process over a data directory that outlives restarts.
type testBroker struct {
	command []string
	dataDir string
	extra   []string
	addr    string
	mu      sync.Mutex
	cmd     *exec.Cmd
	waited  chan struct{}
	others  map[string]string // "tls" -> host:port, "websocket" -> ws://host:port/path
	changed chan struct{}
	live    chan string // every later listening line of a backup that took over
}

func serverCommand() ([]string, error) {
	command := strings.Fields(os.Getenv("PYMQ_SERVER"))
	if len(command) == 0 {
		path, err := exec.LookPath("pymq-server")
		if err != nil {
			return nil, fmt.Errorf("no broker: set PYMQ_BROKER_ADDR or PYMQ_SERVER, or put pymq-server on PATH")
		}
		command = []string{path}
	}
	return command, nil
}

// newBroker starts a broker on a free port with a fresh data directory; extra arguments (a --config) are
// passed on every start.
func newBroker(extra ...string) (*testBroker, error) {
	command, err := serverCommand()
	if err != nil {
		return nil, err
	}
	dataDir, err := os.MkdirTemp("", "pymq-go-test-")
	if err != nil {
		return nil, err
	}
	b := &testBroker{command: command, dataDir: dataDir, extra: extra, others: map[string]string{},
		changed: make(chan struct{}, 1)}
	if err := b.start("0"); err != nil {
		os.RemoveAll(dataDir)
		return nil, err
	}
	return b, nil
}

// start runs the broker on port ("0": a free one) and waits for its listening line, or for its line
// saying it waits as a backup (b.addr stays empty; awaitLive waits for its takeover).
func (b *testBroker) start(port string) error {
	args := append(append([]string{}, b.command[1:]...), "--host", "127.0.0.1", "--port", port, "--data-dir", b.dataDir)
	args = append(args, b.extra...)
	cmd := exec.Command(b.command[0], args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("cannot start %v: %w", b.command, err)
	}
	found := make(chan string, 1)
	b.live = make(chan string, 4)
	live := b.live
	var log strings.Builder
	go func() {
		r := bufio.NewReader(stderr)
		first := true
		for {
			line, err := r.ReadString('\n')
			if m := listening.FindStringSubmatch(line); m != nil {
				if first {
					found <- m[1]
				} else {
					live <- m[1]
				}
				first = false
			} else if backupLine.MatchString(line) && first {
				found <- ""
				first = false
			} else if m := otherListener.FindStringSubmatch(line); m != nil {
				b.mu.Lock()
				b.others[m[1]] = m[2]
				b.mu.Unlock()
				select {
				case b.changed <- struct{}{}:
				default:
				}
			} else if len(line) > 0 && log.Len() < 8192 {
				log.WriteString(line)
			}
			if err != nil {
				if err != io.EOF {
					fmt.Fprintln(os.Stderr, "broker stderr:", err)
				}
				close(found)
				return
			}
		}
	}()
	waited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(waited) }()
	b.mu.Lock()
	b.cmd, b.waited = cmd, waited
	b.mu.Unlock()
	select {
	case addr, ok := <-found:
		if !ok {
			b.stop()
			return fmt.Errorf("%v exited before listening:\n%s", b.command, log.String())
		}
		b.addr = addr
		return nil
	case <-time.After(60 * time.Second):
		b.stop()
		return fmt.Errorf("%v did not report its port within 60 s", b.command)
	}
}

// awaitLive waits until a broker started as a backup takes over and listens.
func (b *testBroker) awaitLive(t *testing.T, within time.Duration) string {
	t.Helper()
	select {
	case addr := <-b.live:
		b.addr = addr
		return addr
	case <-time.After(within):
		t.Fatalf("the backup did not take over within %v", within)
		return ""
	}
}

// stop ends the broker with SIGTERM (a clean stop that keeps persistent messages), SIGKILL after 15 s.
func (b *testBroker) stop() {
	b.mu.Lock()
	cmd, waited := b.cmd, b.waited
	b.cmd = nil
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-waited:
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-waited
	}
}

// listener returns the address of another listener ("tls" or "websocket") once the broker announced it.
func (b *testBroker) listener(t *testing.T, kind string) string {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		b.mu.Lock()
		v := b.others[kind]
		b.mu.Unlock()
		if v != "" {
			return v
		}
		select {
		case <-b.changed:
		case <-deadline:
			t.Fatalf("the broker never announced its %s listener", kind)
		}
	}
}

// restart stops the broker and starts it again on the same port over the same data directory.
func (b *testBroker) restart() error {
	b.stop()
	_, port, _ := strings.Cut(b.addr, ":")
	return b.start(port)
}

func (b *testBroker) remove() {
	b.stop()
	os.RemoveAll(b.dataDir)
}

// config writes a broker YAML config into the data directory's parent and returns its --config arguments.
func writeConfig(t *testing.T, yaml string) []string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "broker.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"--config", path}
}

func TestMain(m *testing.M) {
	stop := func() {}
	if addr := os.Getenv("PYMQ_BROKER_ADDR"); addr != "" {
		brokerAddr = addr
	} else if b, err := newBroker(); err != nil {
		brokerReason = err.Error()
	} else {
		brokerAddr, stop = b.addr, b.remove
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

func inCI() bool {
	ci := strings.ToLower(os.Getenv("CI"))
	return ci != "" && ci != "0" && ci != "false" && ci != "no"
}

func unavailable(t *testing.T, reason string) {
	t.Helper()
	if inCI() {
		t.Fatalf("%s (CI is set: a missing broker is a failure)", reason)
	}
	t.Skip(reason)
}

// needBroker returns the broker address, or skips (fails when CI is set) the test without one.
func needBroker(t *testing.T) string {
	t.Helper()
	if brokerAddr == "" {
		unavailable(t, brokerReason)
	}
	return brokerAddr
}

// ownBroker starts a broker for this test alone (one it may restart or configure).
func ownBroker(t *testing.T, extra ...string) *testBroker {
	t.Helper()
	b, err := newBroker(extra...)
	if err != nil {
		unavailable(t, err.Error())
	}
	t.Cleanup(b.remove)
	return b
}
