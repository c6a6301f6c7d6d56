//go:build cgo

package compattests

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/IBM/sarama"
	"github.com/confluentinc/confluent-kafka-go/v2/kafka"
	kafkago "github.com/segmentio/kafka-go"
)

// TestCaptureFuzzCorpus records the request frames real clients send, as a
// Go fuzz corpus for protocol's FuzzParse (and FuzzReadFrame). It runs only
// when asked:
//
//	cd compat-tests && CAPTURE_FUZZ_CORPUS=../protocol/testdata/fuzz \
//	    SYNAPSE_BIN=../bin/synapse go test -run TestCaptureFuzzCorpus ./...
//
// The broker advertises a proxy that copies every client→broker frame to
// disk, so all of a client's connections go through it.
func TestCaptureFuzzCorpus(t *testing.T) {
	out := os.Getenv("CAPTURE_FUZZ_CORPUS")
	bin := os.Getenv("SYNAPSE_BIN")
	if out == "" || bin == "" {
		t.Skip("set CAPTURE_FUZZ_CORPUS=<dir> and SYNAPSE_BIN to capture a fuzz corpus from real clients")
	}
	ports := freePorts(t, 3)
	dir := t.TempDir()
	proxyAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[2]))
	b := &synapseBroker{bin: bin, port: ports[0], httpPort: ports[1], dataDir: filepath.Join(dir, "data"),
		logPath: filepath.Join(dir, "synapse.log"), advertise: proxyAddr}
	t.Cleanup(func() { b.stop(t, syscall.SIGTERM) })
	cap := startCaptureProxy(t, proxyAddr, b.Addr()) // before Start: the readiness probe follows the advertised address
	b.Start(t)
	pb := proxiedBroker{b, proxyAddr}

	clients := map[string]client{
		"franz-go":   newFranzGo(t, pb),
		"sarama-2.8": &saramaClient{addr: proxyAddr, version: sarama.V2_8_0_0, producers: map[string]sarama.SyncProducer{}},
		"sarama-max": &saramaClient{addr: proxyAddr, version: sarama.MaxVersion, producers: map[string]sarama.SyncProducer{}},
		"kafka-go": &kafkaGo{addr: proxyAddr, transport: &kafkago.Transport{DialTimeout: 5 * time.Second, MetadataTTL: time.Second},
			writers: map[string]*kafkago.Writer{}},
		"confluent": &confluentClient{addr: proxyAddr, producers: map[string]*kafka.Producer{}},
	}
	gen := newRecordGen(numPartitions)
	for name, c := range clients {
		ctx := testCtx(t, time.Minute)
		for _, codec := range []string{"none", "zstd"} {
			topic := fmt.Sprintf("capture-%s-%s", name, codec)
			c.createTopic(t, ctx, topic, numPartitions)
			recs := gen.batch(codec, 4, false)
			c.produce(t, ctx, topic, codec, recs)
			c.consume(t, ctx, topic, perPartition(recs))
			c.listOffset(t, ctx, topic, 0, -2)
			c.listOffset(t, ctx, topic, 0, -1)
		}
		c.close()
	}
	n, err := cap.write(filepath.Join(out, "FuzzParse"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %d distinct request frames to %s", n, out)
}

type proxiedBroker struct {
	broker
	addr string
}

func (p proxiedBroker) Addr() string { return p.addr }

type captureProxy struct {
	mu     sync.Mutex
	frames map[[32]byte][]byte
}

func startCaptureProxy(t *testing.T, listen, target string) *captureProxy {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	cp := &captureProxy{frames: map[[32]byte][]byte{}}
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go cp.serve(c, target)
		}
	}()
	return cp
}

func (cp *captureProxy) serve(c net.Conn, target string) {
	defer c.Close()
	up, err := net.Dial("tcp", target)
	if err != nil {
		return
	}
	defer up.Close()
	go io.Copy(c, up)
	var size [4]byte
	for {
		if _, err := io.ReadFull(c, size[:]); err != nil {
			return
		}
		n := binary.BigEndian.Uint32(size[:])
		if n > 200<<20 {
			return
		}
		frame := make([]byte, n)
		if _, err := io.ReadFull(c, frame); err != nil {
			return
		}
		if n <= 64<<10 { // big produce frames add little but disk
			cp.mu.Lock()
			cp.frames[sha256.Sum256(frame)] = frame
			cp.mu.Unlock()
		}
		if _, err := up.Write(append(size[:], frame...)); err != nil {
			return
		}
	}
}

// write stores the frames in Go's fuzz corpus format.
func (cp *captureProxy) write(dir string) (int, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return 0, err
	}
	cp.mu.Lock()
	defer cp.mu.Unlock()
	for sum, f := range cp.frames {
		name := filepath.Join(dir, "captured-"+hex.EncodeToString(sum[:8]))
		data := fmt.Sprintf("go test fuzz v1\n[]byte(%q)\n", f)
		if err := os.WriteFile(name, []byte(data), 0o644); err != nil {
			return 0, err
		}
	}
	return len(cp.frames), nil
}
