package pymq_test

// The integration tests run against a real pymq-server that TestMain starts on a free port with a
// private data directory:
//
//	PYMQ_BROKER_ADDR  use a broker that is already running (host:port) instead
//	PYMQ_SERVER       the command that runs the broker (default: pymq-server from PATH), for example
//	                  "python3 -m pymq_server"; it gets --host 127.0.0.1 --port 0 --data-dir <tmp>
//
// Without either, the integration tests skip, except when CI is set, where they fail.

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
)

var (
	brokerAddr   string
	brokerReason string // why there is no broker
)

var listening = regexp.MustCompile(`pymq-server listening on (\S+:\d+)`)

func startBroker() (addr string, stop func(), err error) {
	command := strings.Fields(os.Getenv("PYMQ_SERVER"))
	if len(command) == 0 {
		path, lookErr := exec.LookPath("pymq-server")
		if lookErr != nil {
			return "", nil, fmt.Errorf("no broker: set PYMQ_BROKER_ADDR or PYMQ_SERVER, or put pymq-server on PATH")
		}
		command = []string{path}
	}
	dataDir, err := os.MkdirTemp("", "pymq-go-test-")
	if err != nil {
		return "", nil, err
	}
	args := append(command[1:], "--host", "127.0.0.1", "--port", "0", "--data-dir", dataDir)
	cmd := exec.Command(command[0], args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", nil, err
	}
	if err := cmd.Start(); err != nil {
		return "", nil, fmt.Errorf("cannot start %v: %w", command, err)
	}
	found := make(chan string, 1)
	var log strings.Builder
	go func() {
		r := bufio.NewReader(stderr)
		for {
			line, err := r.ReadString('\n')
			if m := listening.FindStringSubmatch(line); m != nil {
				found <- m[1]
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
	stop = func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		os.RemoveAll(dataDir)
	}
	select {
	case addr, ok := <-found:
		if !ok {
			stop()
			return "", nil, fmt.Errorf("%v exited before listening:\n%s", command, log.String())
		}
		return addr, stop, nil
	case <-time.After(60 * time.Second):
		stop()
		return "", nil, fmt.Errorf("%v did not report its port within 60 s", command)
	}
}

func TestMain(m *testing.M) {
	stop := func() {}
	if addr := os.Getenv("PYMQ_BROKER_ADDR"); addr != "" {
		brokerAddr = addr
	} else if addr, s, err := startBroker(); err != nil {
		brokerReason = err.Error()
	} else {
		brokerAddr, stop = addr, s
	}
	code := m.Run()
	stop()
	os.Exit(code)
}

// needBroker returns the broker address, or skips (fails when CI is set) the test without one.
func needBroker(t *testing.T) string {
	t.Helper()
	if brokerAddr == "" {
		if ci := strings.ToLower(os.Getenv("CI")); ci != "" && ci != "0" && ci != "false" && ci != "no" {
			t.Fatalf("%s (CI is set: a missing broker is a failure)", brokerReason)
		}
		t.Skip(brokerReason)
	}
	return brokerAddr
}
