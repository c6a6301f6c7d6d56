package tiering

// Test harness for versitygw, the real S3-compatible server (posix backend,
// SigV4 enforced) the S3 tests run against on loopback. Install it with
// tiering/install-versitygw.sh.

import (
	"context"
	"errors"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

const (
	versitygwAccessKey = "synapse-test-access"
	versitygwSecretKey = "synapse-test-secret"
	versitygwRegion    = "us-east-1"
	versitygwBucket    = "synapse-test"
	versitygwStartWait = 20 * time.Second
	versitygwStopWait  = 5 * time.Second
)

// versitygwBin finds the versitygw binary: $VERSITYGW_BIN, else
// $HOME/.cache/synapse-tools/bin/versitygw (or $TOOLS_BIN/versitygw), else
// PATH. It returns "" if there is none.
func versitygwBin() string {
	if b := os.Getenv("VERSITYGW_BIN"); b != "" {
		return b
	}
	var cands []string
	if d := os.Getenv("TOOLS_BIN"); d != "" {
		cands = append(cands, filepath.Join(d, "versitygw"))
	}
	if home, err := os.UserHomeDir(); err == nil {
		cands = append(cands, filepath.Join(home, ".cache", "synapse-tools", "bin", "versitygw"))
	}
	for _, c := range cands {
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return c
		}
	}
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	return ""
}

// versitygwServer is one versitygw process on a loopback port with its own
// posix root. Stop and Start let outage tests take it away and bring it back
// on the same port with the same data.
type versitygwServer struct {
	t    testing.TB
	bin  string
	dir  string // posix root: one directory per bucket
	addr string // 127.0.0.1:PORT
	log  string // stdout+stderr of every run, appended

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd exits
}

// startVersitygw starts versitygw with bucket versitygwBucket (created with
// the S3 API) and returns its endpoint. It skips the test if versitygw is
// not installed, unless TIERING_REQUIRE_S3=1, which makes that a failure.
// The server is stopped when the test ends.
func startVersitygw(t testing.TB) (endpoint string) {
	return runVersitygw(t).Endpoint()
}

// runVersitygw is startVersitygw returning the server, for tests that need
// to stop and restart it.
func runVersitygw(t testing.TB) *versitygwServer {
	t.Helper()
	bin := versitygwBin()
	if bin == "" {
		msg := "versitygw not installed (run tiering/install-versitygw.sh or set VERSITYGW_BIN)"
		if os.Getenv("TIERING_REQUIRE_S3") == "1" {
			t.Fatal(msg + " and TIERING_REQUIRE_S3=1")
		}
		t.Skip(msg)
	}
	base := t.TempDir()
	v := &versitygwServer{
		t:    t,
		bin:  bin,
		dir:  filepath.Join(base, "root"),
		addr: freeAddr(t),
		log:  filepath.Join(base, "versitygw.log"),
	}
	if err := os.Mkdir(v.dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		v.Stop()
		if t.Failed() {
			if b, err := os.ReadFile(v.log); err == nil && len(b) > 0 {
				t.Logf("versitygw output (last 4 KiB):\n%s", tail(b, 4096))
			}
		}
	})
	v.Start()
	v.CreateBucket(versitygwBucket)
	return v
}

// freeAddr returns a loopback address (127.0.0.1:PORT) that was free a
// moment ago.
func freeAddr(t testing.TB) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Endpoint returns http://127.0.0.1:PORT.
func (v *versitygwServer) Endpoint() string { return "http://" + v.addr }

// Bucket returns the bucket created at start.
func (v *versitygwServer) Bucket() string { return versitygwBucket }

// S3Config returns a config for bucket (Bucket() if empty) on this server
// with the server's credentials and a 5 MiB part size.
func (v *versitygwServer) S3Config(bucket, prefix string) S3Config {
	if bucket == "" {
		bucket = v.Bucket()
	}
	return S3Config{
		Bucket:    bucket,
		Prefix:    prefix,
		Endpoint:  v.Endpoint(),
		Region:    versitygwRegion,
		PathStyle: true,
		AccessKey: versitygwAccessKey,
		SecretKey: versitygwSecretKey,
		PartSize:  MinS3PartSize,
	}
}

// Store returns an S3 store on bucket (Bucket() if empty) with prefix.
func (v *versitygwServer) Store(bucket, prefix string) *S3 {
	v.t.Helper()
	s, err := NewS3(context.Background(), v.S3Config(bucket, prefix))
	if err != nil {
		v.t.Fatal(err)
	}
	return s
}

// CreateBucket creates bucket through the S3 API.
func (v *versitygwServer) CreateBucket(bucket string) {
	v.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_, err := v.Store(bucket, "").Client().CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)})
	if err != nil {
		v.t.Fatalf("versitygw: create bucket %q: %v", bucket, err)
	}
}

// Start starts the server (again) on the same port and root and waits until
// it answers HTTP. It is a no-op while the server runs.
func (v *versitygwServer) Start() {
	v.t.Helper()
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cmd != nil {
		select {
		case <-v.done: // it died: start it again
			v.cmd, v.done = nil, nil
		default:
			return
		}
	}
	logf, err := os.OpenFile(v.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		v.t.Fatal(err)
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(v.bin, "--port", v.addr, "--quiet", "posix", v.dir)
	cmd.Env = append(versitygwEnv(),
		"ROOT_ACCESS_KEY="+versitygwAccessKey,
		"ROOT_SECRET_KEY="+versitygwSecretKey)
	cmd.Stdout = logf
	cmd.Stderr = logf
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		v.t.Fatalf("versitygw: start %s: %v", v.bin, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(done)
	}()
	v.cmd, v.done = cmd, done

	deadline := time.Now().Add(versitygwStartWait)
	hc := &http.Client{Timeout: time.Second}
	for {
		select {
		case <-done:
			v.cmd, v.done = nil, nil
			b, _ := os.ReadFile(v.log)
			v.t.Fatalf("versitygw exited at start (%v):\n%s", cmd.ProcessState, tail(b, 4096))
		default:
		}
		// Any HTTP answer (an S3 error for an anonymous request) will do.
		resp, err := hc.Get(v.Endpoint() + "/")
		if err == nil {
			resp.Body.Close()
			return
		}
		if time.Now().After(deadline) {
			v.stopLocked()
			v.t.Fatalf("versitygw did not answer on %s within %v: %v", v.addr, versitygwStartWait, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// versitygwEnv is the environment without versitygw settings that could
// change the server from what the tests expect.
func versitygwEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if strings.HasPrefix(kv, "VGW_") || strings.HasPrefix(kv, "ROOT_") {
			continue
		}
		env = append(env, kv)
	}
	return env
}

// Stop stops the server it started: SIGTERM, then SIGKILL after 5 s. It is
// a no-op when the server is not running.
func (v *versitygwServer) Stop() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.stopLocked()
}

func (v *versitygwServer) stopLocked() {
	if v.cmd == nil {
		return
	}
	cmd, done := v.cmd, v.done
	v.cmd, v.done = nil, nil
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil && !errors.Is(err, os.ErrProcessDone) {
		v.t.Logf("versitygw: SIGTERM pid %d: %v", cmd.Process.Pid, err)
	}
	select {
	case <-done:
		return
	case <-time.After(versitygwStopWait):
	}
	v.t.Logf("versitygw pid %d ignored SIGTERM for %v; killing it", cmd.Process.Pid, versitygwStopWait)
	_ = cmd.Process.Kill()
	<-done
}

// Pid returns the running server's process id, or 0.
func (v *versitygwServer) Pid() int {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.cmd == nil {
		return 0
	}
	return v.cmd.Process.Pid
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}

func TestVersitygwHarness(t *testing.T) {
	v := runVersitygw(t)
	if !strings.HasPrefix(v.Endpoint(), "http://127.0.0.1:") {
		t.Fatalf("endpoint %q", v.Endpoint())
	}
	// The bucket is a real S3 bucket, and SigV4 is enforced.
	ctx := context.Background()
	if _, err := v.Store("", "").Client().HeadBucket(ctx, &s3.HeadBucketInput{Bucket: aws.String(v.Bucket())}); err != nil {
		t.Fatalf("HeadBucket: %v", err)
	}
	bad := v.S3Config("", "")
	bad.SecretKey = "wrong"
	bs, err := NewS3(ctx, bad)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bs.List(ctx, ""); err == nil {
		t.Fatal("List with a wrong secret key succeeded")
	}
	pid := v.Pid()
	v.Stop()
	if v.Pid() != 0 {
		t.Fatal("Pid after Stop")
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Fatalf("versitygw pid %d still running after Stop", pid)
	}
	v.Stop() // idempotent
	v.Start()
	v.Start() // no-op while running
	if _, err := v.Store("", "").List(ctx, ""); err != nil {
		t.Fatalf("List after restart: %v", err)
	}
}
