// Package logbench measures the log engine on the real file system beside
// plain baselines run in the same process on the same directory, and prints
// ratios: absolute figures on a shared machine mean little, ratios measured
// side by side mean more.
package logbench

import (
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/log/internal/testbatch"
)

// Options bound the run. Every loop stops at Duration or Bytes, whichever
// comes first.
type Options struct {
	Dir      string        // scratch directory on the file system to measure
	Duration time.Duration // per append measurement (default 3s)
	Bytes    int64         // per append measurement (default 512 MiB)
	OpenGiB  float64       // size of the open-time data set (default 1)
	Out      io.Writer
}

// Run runs every measurement and prints a report.
func Run(o Options) error {
	if o.Duration <= 0 {
		o.Duration = 3 * time.Second
	}
	if o.Bytes <= 0 {
		o.Bytes = 512 << 20
	}
	if o.OpenGiB <= 0 {
		o.OpenGiB = 1
	}
	w := o.Out
	fmt.Fprintf(w, "log engine benchmark: dir %s, %v or %d MiB per run, durable policy (fdatasync before ack)\n\n", o.Dir, o.Duration, o.Bytes>>20)
	fmt.Fprintf(w, "%-28s %10s %12s %12s %10s %9s\n", "append", "MB/s", "batches/s", "records/s", "fsyncs", "vs plain")
	for _, size := range []int{1 << 10, 16 << 10} {
		plain, err := plainLoop(o, size)
		if err != nil {
			return err
		}
		fmt.Fprintf(w, "%-28s %10.1f %12.0f %12.0f %10d %9s\n", fmt.Sprintf("plain write+fdatasync %s", kib(size)), plain.mbps(), plain.perSec(), plain.perSec()*float64(plain.recordsPerBatch), plain.syncs, "1.00x")
		for _, appenders := range []int{1, 8, 64} {
			r, err := appendRun(o, size, appenders)
			if err != nil {
				return err
			}
			fmt.Fprintf(w, "%-28s %10.1f %12.0f %12.0f %10d %8.2fx\n", fmt.Sprintf("engine %s x %d appenders", kib(size), appenders),
				r.mbps(), r.perSec(), r.perSec()*float64(r.recordsPerBatch), r.syncs, r.mbps()/plain.mbps())
		}
	}
	fmt.Fprintln(w)
	if err := readRun(o); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if err := allocRun(o); err != nil {
		return err
	}
	fmt.Fprintln(w)
	return openRun(o)
}

func kib(n int) string { return fmt.Sprintf("%dKiB", n>>10) }

type result struct {
	bytes, batches  int64
	elapsed         time.Duration
	syncs           int64
	recordsPerBatch int
}

func (r result) mbps() float64   { return float64(r.bytes) / 1e6 / r.elapsed.Seconds() }
func (r result) perSec() float64 { return float64(r.batches) / r.elapsed.Seconds() }

// batchOf returns a batch of size bytes made of records of about 100 bytes
// (1 KiB) or 1 KiB (16 KiB), so records/s means what Kafka users expect.
func batchOf(size int) ([]byte, int) {
	rec := 100
	if size >= 16<<10 {
		rec = 1000
	}
	n := max(size/(rec+10), 1)
	for v := rec; v > 0; v-- {
		b := testbatch.Make(testbatch.Options{Records: n, ValueSize: v, Timestamp: time.Now().UnixMilli()})
		if len(b) <= size {
			return b, n
		}
	}
	return testbatch.Make(testbatch.Options{Records: 1}), 1
}

// plainLoop is the baseline: one writer, sequential write then fdatasync of
// the same bytes, on the same file system.
func plainLoop(o Options, size int) (result, error) {
	path := filepath.Join(o.Dir, "plain.dat")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return result{}, err
	}
	defer os.Remove(path)
	defer f.Close()
	buf, recs := batchOf(size)
	r := result{recordsPerBatch: recs}
	start := time.Now()
	for r.bytes < o.Bytes && time.Since(start) < o.Duration {
		if _, err := f.WriteAt(buf, r.bytes); err != nil {
			return r, err
		}
		if err := datasync(f); err != nil {
			return r, err
		}
		r.bytes += int64(len(buf))
		r.batches++
		r.syncs++
	}
	r.elapsed = time.Since(start)
	return r, nil
}

// countingFS counts fsyncs of files.
type countingFS struct {
	log.FS
	syncs *atomic.Int64
}

type countingFile struct {
	log.File
	syncs *atomic.Int64
}

func (c countingFS) OpenFile(name string, flag int, perm os.FileMode) (log.File, error) {
	f, err := c.FS.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return countingFile{f, c.syncs}, nil
}

func (c countingFile) Sync() error { c.syncs.Add(1); return c.File.Sync() }

// OSFile keeps the engine's preallocation (and sendfile) path.
func (c countingFile) OSFile() *os.File {
	if of, ok := c.File.(log.OSFile); ok {
		return of.OSFile()
	}
	return nil
}

func appendRun(o Options, size, appenders int) (result, error) {
	dir, err := os.MkdirTemp(o.Dir, "append-")
	if err != nil {
		return result{}, err
	}
	defer os.RemoveAll(dir)
	var syncs atomic.Int64
	s := log.OpenStore(log.Options{FS: countingFS{log.OSFS, &syncs}, Preallocate: true})
	defer s.Close()
	p, err := s.OpenPartition(filepath.Join(dir, "bench-0"), log.Config{MaxMessageBytes: 1 << 20})
	if err != nil {
		return result{}, err
	}
	proto, recs := batchOf(size)
	var bytes, batches atomic.Int64
	var firstErr atomic.Pointer[error]
	syncs.Store(0)
	start := time.Now()
	deadline := start.Add(o.Duration)
	var wg sync.WaitGroup
	for i := 0; i < appenders; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := append([]byte(nil), proto...)
			for bytes.Load() < o.Bytes && time.Now().Before(deadline) {
				res, err := p.Append(b)
				if err == nil {
					err = p.WaitDurable(res.LastOffset + 1)
				}
				if err != nil {
					firstErr.CompareAndSwap(nil, &err)
					return
				}
				bytes.Add(int64(len(b)))
				batches.Add(1)
			}
		}()
	}
	wg.Wait()
	r := result{bytes: bytes.Load(), batches: batches.Load(), elapsed: time.Since(start), syncs: syncs.Load(), recordsPerBatch: recs}
	if e := firstErr.Load(); e != nil {
		return r, *e
	}
	return r, p.Close()
}

// readRun fills a partition and reads it back sequentially from the page
// cache, with 1 MiB fetches, copying the bytes (the path without sendfile).
func readRun(o Options) error {
	dir, err := os.MkdirTemp(o.Dir, "read-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	s := log.OpenStore(log.Options{SyncInterval: time.Second})
	defer s.Close()
	p, err := s.OpenPartition(filepath.Join(dir, "bench-0"), log.Config{})
	if err != nil {
		return err
	}
	b, _ := batchOf(1 << 10)
	total := int64(256 << 20)
	for n := int64(0); n < total; n += int64(len(b)) {
		if _, err := p.Append(b); err != nil {
			return err
		}
	}
	if err := p.Sync(); err != nil {
		return err
	}
	w := o.Out
	fmt.Fprintf(w, "%-40s %10s %12s\n", "read (page cache, 1 MiB fetches)", "MB/s", "fetches/s")
	for _, mode := range []string{"locate only (zero-copy path)", "locate + copy to user memory"} {
		buf := make([]byte, 0, 2<<20)
		var bytes, fetches int64
		start := time.Now()
		for pass := 0; pass < 4; pass++ {
			for off := int64(0); off < p.HighWatermark(); {
				res, err := p.Read(off, 1<<20)
				if err != nil {
					return err
				}
				if mode != "locate only (zero-copy path)" {
					if buf, err = res.AppendTo(buf[:0]); err != nil {
						return err
					}
				}
				bytes += res.Bytes
				fetches++
				off = res.NextOffset
				res.Release()
			}
		}
		el := time.Since(start).Seconds()
		fmt.Fprintf(w, "%-40s %10.0f %12.0f\n", mode, float64(bytes)/1e6/el, float64(fetches)/el)
	}
	return p.Close()
}

// allocRun reports allocations per append and per read with the testing
// package's allocation counter.
func allocRun(o Options) error {
	dir, err := os.MkdirTemp(o.Dir, "alloc-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	s := log.OpenStore(log.Options{SyncInterval: time.Hour})
	defer s.Close()
	p, err := s.OpenPartition(filepath.Join(dir, "bench-0"), log.Config{})
	if err != nil {
		return err
	}
	b, recs := batchOf(1 << 10)
	ar := testing.Benchmark(func(tb *testing.B) {
		tb.ReportAllocs()
		for i := 0; i < tb.N; i++ {
			if _, err := p.Append(b); err != nil {
				tb.Fatal(err)
			}
		}
	})
	rr := testing.Benchmark(func(tb *testing.B) {
		tb.ReportAllocs()
		hw := p.HighWatermark()
		for i := 0; i < tb.N; i++ {
			res, err := p.Read(int64(i*997)%hw, 64<<10)
			if err != nil {
				tb.Fatal(err)
			}
			res.Release()
		}
	})
	fmt.Fprintf(o.Out, "allocations: append of a 1 KiB batch (%d records): %d allocs/op, %d B/op, %v/op (no fsync)\n", recs, ar.AllocsPerOp(), ar.AllocedBytesPerOp(), time.Duration(ar.NsPerOp()))
	fmt.Fprintf(o.Out, "allocations: read of 64 KiB (locate):           %d allocs/op, %d B/op, %v/op\n", rr.AllocsPerOp(), rr.AllocedBytesPerOp(), time.Duration(rr.NsPerOp()))
	return p.Close()
}

// openRun measures opening a partition holding OpenGiB in 128 MiB segments
// after a clean close and after a crash (no close: the active segment is
// scanned).
func openRun(o Options) error {
	dir, err := os.MkdirTemp(o.Dir, "open-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	pdir := filepath.Join(dir, "bench-0")
	s := log.OpenStore(log.Options{SyncInterval: time.Hour})
	p, err := s.OpenPartition(pdir, log.Config{MaxMessageBytes: 1 << 20})
	if err != nil {
		return err
	}
	b, _ := batchOf(64 << 10)
	total := int64(o.OpenGiB * (1 << 30))
	// Fill whole segments and stop one batch short of the last one's end, so
	// the active segment is nearly full: the worst case for the crash scan.
	perSeg := int64(log.DefaultSegmentBytes / len(b))
	wantSegs := max((total+log.DefaultSegmentBytes-1)/log.DefaultSegmentBytes, 1)
	for n := int64(0); n < perSeg*wantSegs-1; n++ {
		if _, err := p.Append(b); err != nil {
			return err
		}
	}
	if err := p.Sync(); err != nil {
		return err
	}
	segs := 0
	names, _ := os.ReadDir(pdir)
	for _, n := range names {
		if filepath.Ext(n.Name()) == ".log" {
			segs++
		}
	}
	// "Crash": the store is abandoned without Close; a new store opens the
	// directory as a restarted process would.
	crash := timeOpen(pdir, 3)
	if err := p.Close(); err != nil {
		return err
	}
	s.Close()
	clean := timeOpen(pdir, 3)
	fmt.Fprintf(o.Out, "open %.1f GiB partition in %d segments: clean %v, after crash %v (median of 3)\n", o.OpenGiB, segs, clean, crash)
	return nil
}

func timeOpen(dir string, n int) time.Duration {
	var ds []time.Duration
	for i := 0; i < n; i++ {
		s := log.OpenStore(log.Options{SyncInterval: time.Hour})
		start := time.Now()
		_, err := s.OpenPartition(dir, log.Config{MaxMessageBytes: 1 << 20})
		d := time.Since(start)
		if err != nil {
			return -1
		}
		ds = append(ds, d)
		// Do not Close: a clean close would rewrite the state and turn the
		// next "crash" open into a clean one. Drop the store instead.
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds[len(ds)/2]
}
