package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"path/filepath"
	"testing"

	"github.com/synapsebroker/synapse/log"
)

// testTimestamp is the base timestamp of test batches: 2023-11-14T22:13:20Z.
const testTimestamp = 1_700_000_000_000

// makeBatch returns a valid Kafka v2 RecordBatch with baseOffset 0 holding
// records records (the log never parses the record bytes, so they are
// filler). Timestamps run from ts to ts+records-1.
func makeBatch(records int, ts int64, fill byte) []byte {
	payload := bytes.Repeat([]byte{fill}, 10*records)
	b := make([]byte, 61, 61+len(payload))
	be := binary.BigEndian
	be.PutUint32(b[8:], uint32(len(b)+len(payload)-12)) // batchLength
	b[16] = 2                                           // magic
	be.PutUint32(b[23:], uint32(records-1))             // lastOffsetDelta
	be.PutUint64(b[27:], uint64(ts))                    // baseTimestamp
	be.PutUint64(b[35:], uint64(ts+int64(records)-1))   // maxTimestamp
	be.PutUint64(b[43:], ^uint64(0))                    // producerId -1
	be.PutUint16(b[51:], ^uint16(0))                    // producerEpoch -1
	be.PutUint32(b[53:], ^uint32(0))                    // baseSequence -1
	be.PutUint32(b[57:], uint32(records))               // recordCount
	b = append(b, payload...)
	be.PutUint32(b[17:], crc32.Checksum(b[21:], crc32.MakeTable(crc32.Castagnoli)))
	return b
}

// writePartition appends n batches of 3 records (batch i has timestamps
// testTimestamp+1000*i...) to a new partition in dir with real log appends,
// then closes it cleanly.
func writePartition(t *testing.T, dir string, cfg log.Config, n int) {
	t.Helper()
	store := log.OpenStore(log.Options{})
	p, err := store.OpenPartition(dir, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		res, err := p.Append(makeBatch(3, testTimestamp+1000*int64(i), byte(i)))
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		if want := int64(3 * i); res.BaseOffset != want {
			t.Fatalf("append %d: base offset %d, want %d", i, res.BaseOffset, want)
		}
	}
	if err := p.Sync(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := store.Close(); err != nil {
		t.Fatal(err)
	}
}

// segmentPath is the .log file of the segment with base offset base.
func segmentPath(dir string, base int64) string {
	return filepath.Join(dir, fmt.Sprintf("%020d.log", base))
}

// run executes the root command with args and returns stdout and stderr.
func run(t *testing.T, ctx context.Context, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	cmd := newRootCommand()
	cmd.SetArgs(args)
	cmd.SetOut(&out)
	cmd.SetErr(&errOut)
	err = cmd.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}
