package compattests

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The test harness: a broker the clients talk to over TCP on loopback.
//
// COMPAT_TARGET picks it:
//   - "synapse" (default): a `$SYNAPSE_BIN serve` child process on a free
//     loopback port with a temporary data directory.
//   - "kfake": franz-go's in-process fake Kafka (pkg/kfake), used to prove the
//     tests themselves right without the real broker.

const (
	targetSynapse = "synapse"
	targetKfake   = "kfake"

	// readyTimeout bounds how long a (re)started broker may take to accept
	// connections and answer ApiVersions + Metadata.
	readyTimeout = 20 * time.Second
	// stopTimeout bounds how long a broker may take to exit after SIGTERM
	// before it is killed with SIGKILL (and the test fails).
	stopTimeout = 10 * time.Second
	// logTail is how much of the broker's log a failed test prints.
	logTail = 64 << 10
)

// broker is one broker that a test owns for its whole life. Methods take the
// calling (sub)test so that failures are reported where they happen.
type broker interface {
	// Target is targetSynapse or targetKfake.
	Target() string
	// Addr is the host:port clients bootstrap from.
	Addr() string
	// Restart stops the broker gracefully (SIGTERM for a process) and starts
	// it again on the same port and data directory, returning once it is
	// ready. Skips the test where the target cannot restart.
	Restart(t testing.TB)
	// Kill9 kills the broker without warning (SIGKILL). Start brings it back.
	// Skips the test where the target cannot be killed.
	Kill9(t testing.TB)
	// Start starts a stopped broker on the same port and data directory.
	Start(t testing.TB)
}

func compatTarget() string {
	if v := os.Getenv("COMPAT_TARGET"); v != "" {
		return v
	}
	return targetSynapse
}

// newBroker starts a broker for t and stops it when t ends. Without a
// broker to test (SYNAPSE_BIN unset on the synapse target) t is skipped.
func newBroker(t testing.TB) broker {
	t.Helper()
	switch target := compatTarget(); target {
	case targetSynapse:
		bin := os.Getenv("SYNAPSE_BIN")
		if bin == "" {
			skipUnlessRequired(t, "SYNAPSE_BIN is not set: build the broker (make build) and run "+
				"`SYNAPSE_BIN=../bin/synapse go test ./...`, or `COMPAT_TARGET=kfake go test ./...` "+
				"to run against franz-go's in-process fake")
		}
		abs, err := filepath.Abs(bin)
		if err != nil {
			t.Fatalf("SYNAPSE_BIN %q: %v", bin, err)
		}
		if fi, err := os.Stat(abs); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			t.Fatalf("SYNAPSE_BIN %q is not an executable file (stat: %v)", bin, err)
		}
		return startSynapse(t, abs)
	case targetKfake:
		return startKfake(t)
	default:
		t.Fatalf("COMPAT_TARGET=%q: want %q or %q", target, targetSynapse, targetKfake)
		return nil
	}
}

// freePorts returns n distinct loopback ports that were free a moment ago:
// each is bound on 127.0.0.1:0 and all are closed only after all are bound.
func freePorts(t testing.TB, n int) []int {
	t.Helper()
	var ports []int
	var lns []net.Listener
	defer func() {
		for _, ln := range lns {
			ln.Close()
		}
	}()
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatalf("pick a free port: %v", err)
		}
		lns = append(lns, ln)
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

// waitReady waits until addr accepts TCP connections and answers
// ApiVersions and Metadata through kadm, for at most readyTimeout. exited,
// if not nil, reports a process that died meanwhile.
func waitReady(t testing.TB, addr string, exited <-chan struct{}) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	var last error
	for attempt := 0; ; attempt++ {
		select {
		case <-exited:
			return fmt.Errorf("broker exited while starting (last probe error: %v)", last)
		default:
		}
		if last = probe(ctx, addr); last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("broker at %s not ready after %s (%d probes): %w", addr, readyTimeout, attempt+1, last)
		case <-exited:
			return fmt.Errorf("broker exited while starting (last probe error: %v)", last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

func probe(ctx context.Context, addr string) error {
	d := net.Dialer{Timeout: time.Second}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return err
	}
	conn.Close()

	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DialTimeout(time.Second), kgo.RetryTimeout(2*time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	adm := kadm.NewClient(cl)
	pctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	versions, err := adm.ApiVersions(pctx)
	if err != nil {
		return fmt.Errorf("ApiVersions: %w", err)
	}
	for _, v := range versions {
		if v.Err != nil {
			return fmt.Errorf("ApiVersions from node %d: %w", v.NodeID, v.Err)
		}
	}
	md, err := adm.BrokerMetadata(pctx)
	if err != nil {
		return fmt.Errorf("Metadata: %w", err)
	}
	if len(md.Brokers) == 0 {
		return errors.New("Metadata lists no brokers")
	}
	return nil
}

// ---- synapse: a child process ----------------------------------------------

type synapseBroker struct {
	bin      string
	port     int
	httpPort int
	dataDir  string
	logPath  string

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd.Wait returned
	waitErr error         // cmd.Wait's result, valid after exited is closed
	logFile *os.File
	starts  int

	advertise string // advertised address if not the listener's (capture proxy)

	// Secure brokers (secure_harness_test.go): --listeners replaces
	// --listen / --advertised-addr; extra flags and environment.
	listeners string
	extraArgs []string
	extraEnv  []string
}

func startSynapse(t testing.TB, bin string) *synapseBroker {
	t.Helper()
	return startSynapseWith(t, bin, nil)
}

// startSynapseWith is startSynapse with setup run on the broker before its
// first start (secure brokers set their listeners and flags there).
func startSynapseWith(t testing.TB, bin string, setup func(b *synapseBroker)) *synapseBroker {
	t.Helper()
	ports := freePorts(t, 2)
	dir := t.TempDir()
	b := &synapseBroker{
		bin:      bin,
		port:     ports[0],
		httpPort: ports[1],
		dataDir:  filepath.Join(dir, "data"),
		logPath:  filepath.Join(dir, "synapse.log"),
	}
	// Registered after TempDir, so it runs before the directory is removed.
	t.Cleanup(func() {
		b.stop(t, syscall.SIGTERM)
		if t.Failed() {
			b.dumpLog(t)
		}
		if b.logFile != nil {
			b.logFile.Close()
		}
	})
	if setup != nil {
		setup(b)
	}
	b.Start(t)
	return b
}

func (b *synapseBroker) Target() string { return targetSynapse }

func (b *synapseBroker) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

// args is the exact command line the harness runs; README.md lists it.
func (b *synapseBroker) args() []string {
	listen := []string{"--listen", b.Addr(), "--advertised-addr", cmp.Or(b.advertise, b.Addr())}
	if b.listeners != "" {
		listen = []string{"--listeners", b.listeners}
	}
	return append(append([]string{"serve"}, listen...), append([]string{
		"--data-dir", b.dataDir,
		"--http-listen", net.JoinHostPort("127.0.0.1", strconv.Itoa(b.httpPort)),
		"--log-level", "warn",
		// Consumer groups: no delay before the first rebalance of a new
		// group, and session timeouts down to 1 s, so the group tests run
		// fast and can have a member evicted in seconds.
		"--group-initial-rebalance-delay", "0s",
		"--group-min-session-timeout", "1s",
	}, b.extraArgs...)...)
}

func (b *synapseBroker) Start(t testing.TB) {
	t.Helper()
	b.mu.Lock()
	if b.cmd != nil {
		b.mu.Unlock()
		t.Fatalf("synapse: Start while pid %d is running", b.cmd.Process.Pid)
	}
	if b.logFile == nil {
		f, err := os.OpenFile(b.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
		if err != nil {
			b.mu.Unlock()
			t.Fatalf("synapse log file: %v", err)
		}
		b.logFile = f
	}
	b.starts++
	args := b.args()
	fmt.Fprintf(b.logFile, "=== compat-tests: start #%d: %s %s\n", b.starts, b.bin, strings.Join(args, " "))
	cmd := exec.Command(b.bin, args...)
	cmd.Stdout = b.logFile
	cmd.Stderr = b.logFile
	cmd.Env = append(os.Environ(), b.extraEnv...)
	if err := cmd.Start(); err != nil {
		b.mu.Unlock()
		t.Fatalf("start %s: %v", b.bin, err)
	}
	exited := make(chan struct{})
	b.cmd, b.exited = cmd, exited
	go func() {
		err := cmd.Wait()
		b.mu.Lock()
		b.waitErr = err
		b.mu.Unlock()
		close(exited)
	}()
	b.mu.Unlock()

	if err := waitReady(t, b.Addr(), exited); err != nil {
		// The log is printed by the cleanup of the failed test.
		t.Fatalf("synapse (pid %d) start #%d: %v", cmd.Process.Pid, b.starts, err)
	}
}

// stop signals the process this broker started (by its PID) and waits for it
// to exit; after stopTimeout it sends SIGKILL and reports an error. A
// SIGTERM that does not end in exit status 0 is an error too.
func (b *synapseBroker) stop(t testing.TB, sig syscall.Signal) {
	t.Helper()
	b.mu.Lock()
	cmd, exited := b.cmd, b.exited
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	pid := cmd.Process.Pid
	crashed := false
	select {
	case <-exited:
		crashed = true
	default:
		if err := cmd.Process.Signal(sig); err != nil {
			t.Errorf("%s to synapse pid %d: %v", sigName(sig), pid, err)
		}
		select {
		case <-exited:
		case <-time.After(stopTimeout):
			t.Errorf("synapse (pid %d) still running %s after %s; sending SIGQUIT (goroutine dump to its log), then SIGKILL", pid, stopTimeout, sigName(sig))
			_ = cmd.Process.Signal(syscall.SIGQUIT)
			select {
			case <-exited:
			case <-time.After(2 * time.Second):
				_ = cmd.Process.Kill()
				<-exited
			}
		}
	}
	b.mu.Lock()
	waitErr := b.waitErr
	b.cmd, b.exited, b.waitErr = nil, nil, nil
	if crashed {
		fmt.Fprintf(b.logFile, "=== compat-tests: pid %d had exited on its own: %v\n", pid, waitErr)
	} else {
		fmt.Fprintf(b.logFile, "=== compat-tests: pid %d stopped by %s: %v\n", pid, sigName(sig), waitErr)
	}
	b.mu.Unlock()
	switch {
	case crashed:
		t.Errorf("synapse (pid %d) exited on its own before it was stopped: %v", pid, waitErr)
	case sig == syscall.SIGTERM && waitErr != nil:
		t.Errorf("synapse (pid %d) after SIGTERM: %v (want exit status 0)", pid, waitErr)
	}
}

func sigName(sig syscall.Signal) string {
	switch sig {
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGKILL:
		return "SIGKILL"
	}
	return sig.String()
}

func (b *synapseBroker) Restart(t testing.TB) {
	t.Helper()
	b.stop(t, syscall.SIGTERM)
	b.Start(t)
}

func (b *synapseBroker) Kill9(t testing.TB) {
	t.Helper()
	b.stop(t, syscall.SIGKILL)
}

func (b *synapseBroker) dumpLog(t testing.TB) { dumpLogFile(t, b.logPath) }

// dumpLogFile logs the last logTail bytes of a broker's log file.
func dumpLogFile(t testing.TB, path string) {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Logf("synapse log %s: %v", path, err)
		return
	}
	if len(data) > logTail {
		data = append([]byte("...\n"), data[len(data)-logTail:]...)
	}
	t.Logf("synapse log (%s):\n%s", path, data)
}

// ---- kfake: in-process ------------------------------------------------------

type kfakeBroker struct {
	port int
	dir  string
	mu   sync.Mutex
	c    *kfake.Cluster
}

func startKfake(t testing.TB) *kfakeBroker {
	t.Helper()
	b := &kfakeBroker{port: freePorts(t, 1)[0], dir: t.TempDir()}
	t.Cleanup(func() {
		b.mu.Lock()
		defer b.mu.Unlock()
		if b.c != nil {
			b.c.Close()
			b.c = nil
		}
	})
	b.Start(t)
	return b
}

func (b *kfakeBroker) Target() string { return targetKfake }

func (b *kfakeBroker) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(b.port)) }

func (b *kfakeBroker) Start(t testing.TB) {
	t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.c != nil {
		t.Fatal("kfake: Start while running")
	}
	// One broker on a fixed port, persisted to disk so Restart keeps the
	// data; auto-created topics get one partition like synapse's default.
	c, err := kfake.NewCluster(
		kfake.Ports(b.port),
		kfake.DataDir(b.dir),
		kfake.SyncWrites(),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(1),
		kfake.ClusterID("compat-tests"),
		// Like synapse's --group-min-session-timeout above (kfake has no
		// initial rebalance delay).
		kfake.GroupMinSessionTimeout(time.Second),
	)
	if err != nil {
		t.Fatalf("kfake: %v", err)
	}
	b.c = c
	if err := waitReady(t, b.Addr(), nil); err != nil {
		t.Fatalf("kfake: %v", err)
	}
}

// Restart closes the cluster (which persists its state to the data
// directory) and opens a new one on the same port and directory.
func (b *kfakeBroker) Restart(t testing.TB) {
	t.Helper()
	b.mu.Lock()
	if b.c != nil {
		b.c.Close()
		b.c = nil
	}
	b.mu.Unlock()
	b.Start(t)
}

func (b *kfakeBroker) Kill9(t testing.TB) {
	t.Helper()
	t.Skip("kfake runs inside the test process and cannot be killed with SIGKILL")
}

// ---- helpers shared by the client tests -------------------------------------

var topicUnsafe = regexp.MustCompile(`[^a-zA-Z0-9-]+`)

// uniqueTopic returns a topic name unique to t and this run: the test name
// with anything but letters, digits and '-' squeezed to '-', plus a suffix.
func uniqueTopic(t testing.TB) string {
	name := strings.Trim(topicUnsafe.ReplaceAllString(t.Name(), "-"), "-")
	if len(name) > 180 {
		name = name[:180]
	}
	return fmt.Sprintf("%s-%x", strings.ToLower(name), time.Now().UnixNano()&0xffffff)
}

// testCtx returns a context bounded by d (and by the test's deadline).
func testCtx(t testing.TB, d time.Duration) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// skipUnlessRequired skips t with msg, or fails it when COMPAT_REQUIRE=1
// (what `make test` sets): there, a missing client or tool must not turn
// into a green run that tested nothing.
func skipUnlessRequired(t testing.TB, msg string) {
	t.Helper()
	if os.Getenv("COMPAT_REQUIRE") == "1" {
		t.Fatal("COMPAT_REQUIRE=1: " + msg)
	}
	t.Skip(msg)
}
