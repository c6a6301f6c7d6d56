package broker

import (
	"encoding/binary"
	"runtime"
	"testing"
)

// TestFindRecordLogAppendTimeClaimsNoMemory: a LogAppendTime batch that
// claims 150 million records (a compressed batch may, per MiB of bytes) is
// answered from its header, without a list of its records (2.4 GB).
func TestFindRecordLogAppendTimeClaimsNoMemory(t *testing.T) {
	b := make([]byte, 61+16)
	be := binary.BigEndian
	be.PutUint64(b[0:], 1000)              // base offset
	be.PutUint32(b[8:], uint32(len(b)-12)) // batch length
	b[16] = 2                              // magic
	be.PutUint16(b[21:], 0x8|0x1)          // LogAppendTime, gzip
	be.PutUint32(b[23:], 150_000_000-1)    // last offset delta
	be.PutUint64(b[27:], 5)                // base timestamp
	be.PutUint64(b[35:], 777)              // max timestamp: the append time
	be.PutUint32(b[57:], 150_000_000)      // records
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	r, ok, err := findRecord(b, 0, atOrAfter(700))
	runtime.ReadMemStats(&after)
	if err != nil || !ok || r.offset != 1000 || r.ts != 777 {
		t.Fatalf("found %+v %v %v, want offset 1000 at 777", r, ok, err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("allocated %d bytes", grew)
	}
	if r, ok, _ := findRecord(b, 1500, atOrAfter(700)); !ok || r.offset != 1500 {
		t.Fatalf("from the log start 1500: %+v %v", r, ok)
	}
	if _, ok, _ := findRecord(b, 0, atOrAfter(778)); ok {
		t.Fatal("found a record after every timestamp in the batch")
	}
	if _, ok, _ := findRecord(b, 1000+150_000_000, atOrAfter(0)); ok {
		t.Fatal("found a record past the batch")
	}
}
