package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/synapsebroker/synapse/log"
)

type dumpOptions struct {
	json bool
}

func (o *dumpOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.json, "json", false, "print one JSON object per line instead of key=value text")
}

func newInspectDumpCommand() *cobra.Command {
	o := &dumpOptions{}
	cmd := &cobra.Command{
		Use:   "dump <segment.log>...",
		Short: "Print the header of every record batch in segment files",
		Long: `Print one line per record batch of each segment (.log) file: position,
offsets, record count, size, timestamps, codec, flags, producer fields, CRC.
Every batch is checked (framing, magic 2, CRC-32C, offset continuity); the walk
stops at the first bad one, says where and why, and the command exits non-zero.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return dumpFunc(cmd.OutOrStdout(), o, args)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// dumpBatch is one output line of `inspect dump --json`. Field names are
// Kafka's.
type dumpBatch struct {
	File          string `json:"file"`
	Position      int64  `json:"position"`
	BaseOffset    int64  `json:"baseOffset"`
	LastOffset    int64  `json:"lastOffset"`
	Records       int32  `json:"records"`
	Size          int32  `json:"size"`
	BaseTimestamp int64  `json:"baseTimestamp"`
	BaseTime      string `json:"baseTime,omitempty"`
	MaxTimestamp  int64  `json:"maxTimestamp"`
	MaxTime       string `json:"maxTime,omitempty"`
	Codec         string `json:"codec"`
	TimestampType string `json:"timestampType"`
	Transactional bool   `json:"transactional"`
	Control       bool   `json:"control"`
	ProducerID    int64  `json:"producerId"`
	ProducerEpoch int16  `json:"producerEpoch"`
	BaseSequence  int32  `json:"baseSequence"`
	LeaderEpoch   int32  `json:"partitionLeaderEpoch"`
	CRC           uint32 `json:"crc"`
}

// dumpStop is the last line for a file whose walk stopped before its end.
type dumpStop struct {
	File      string `json:"file"`
	StoppedAt int64  `json:"stoppedAt"`
	Size      int64  `json:"size"`
	Reason    string `json:"reason"`
}

func newDumpBatch(file string, b log.SegmentBatch) dumpBatch {
	h := &b.Header
	tsType := "CreateTime"
	if h.LogAppendTime() {
		tsType = "LogAppendTime"
	}
	return dumpBatch{
		File:          file,
		Position:      b.Pos,
		BaseOffset:    h.BaseOffset,
		LastOffset:    h.LastOffset(),
		Records:       h.NumRecords,
		Size:          h.Length,
		BaseTimestamp: h.BaseTimestamp,
		BaseTime:      formatMillis(h.BaseTimestamp),
		MaxTimestamp:  h.MaxTimestamp,
		MaxTime:       formatMillis(h.MaxTimestamp),
		Codec:         h.Codec().String(),
		TimestampType: tsType,
		Transactional: h.Transactional(),
		Control:       h.Control(),
		ProducerID:    h.ProducerID,
		ProducerEpoch: h.ProducerEpoch,
		BaseSequence:  h.BaseSequence,
		LeaderEpoch:   h.LeaderEpoch,
		CRC:           h.CRC,
	}
}

// text renders the batch as one key=value line.
func (d *dumpBatch) text() string {
	orDash := func(s string) string {
		if s == "" {
			return "-"
		}
		return s
	}
	return fmt.Sprintf("position=%d baseOffset=%d lastOffset=%d records=%d size=%d "+
		"baseTimestamp=%d baseTime=%s maxTimestamp=%d maxTime=%s codec=%s timestampType=%s "+
		"transactional=%t control=%t producerId=%d producerEpoch=%d baseSequence=%d "+
		"partitionLeaderEpoch=%d crc=0x%08x",
		d.Position, d.BaseOffset, d.LastOffset, d.Records, d.Size,
		d.BaseTimestamp, orDash(d.BaseTime), d.MaxTimestamp, orDash(d.MaxTime), d.Codec, d.TimestampType,
		d.Transactional, d.Control, d.ProducerID, d.ProducerEpoch, d.BaseSequence,
		d.LeaderEpoch, d.CRC)
}

func dumpFunc(w io.Writer, o *dumpOptions, paths []string) error {
	enc := json.NewEncoder(w)
	var stopped []string
	for _, path := range paths {
		if !o.json {
			fmt.Fprintf(w, "# %s\n", path)
		}
		var batches, bytes int64
		var werr error
		stoppedAt, reason, err := log.DumpSegment(log.OSFS, path, func(b log.SegmentBatch) {
			batches++
			bytes += int64(b.Header.Length)
			if werr != nil {
				return
			}
			d := newDumpBatch(path, b)
			if o.json {
				werr = enc.Encode(&d)
			} else {
				_, werr = fmt.Fprintln(w, d.text())
			}
		})
		if err != nil {
			return fmt.Errorf("dump: %w", err)
		}
		if werr != nil {
			return werr
		}
		if err := dumpAborted(w, enc, o, path); err != nil {
			return err
		}
		if reason == "" {
			if !o.json {
				fmt.Fprintf(w, "# %d batches, %d bytes\n", batches, bytes)
			}
			continue
		}
		size := int64(-1)
		if fi, err := os.Stat(path); err == nil {
			size = fi.Size()
		}
		stopped = append(stopped, path)
		if o.json {
			if err := enc.Encode(&dumpStop{File: path, StoppedAt: stoppedAt, Size: size, Reason: reason}); err != nil {
				return err
			}
		} else {
			fmt.Fprintf(w, "# %d batches, %d bytes; STOPPED at byte %d of %d: %s\n",
				batches, bytes, stoppedAt, size, reason)
		}
	}
	if len(stopped) > 0 {
		return fmt.Errorf("walk stopped before the end of %s", strings.Join(stopped, ", "))
	}
	return nil
}

// dumpAbortedTxn is a line of `inspect dump --json` for an entry of the
// segment's aborted-transaction index (.txnindex).
type dumpAbortedTxn struct {
	File             string `json:"file"`
	ProducerID       int64  `json:"producerId"`
	FirstOffset      int64  `json:"firstOffset"`
	LastOffset       int64  `json:"lastOffset"`
	LastStableOffset int64  `json:"lastStableOffset"`
}

// dumpAborted prints the entries of the .txnindex beside segment path, if
// there is one.
func dumpAborted(w io.Writer, enc *json.Encoder, o *dumpOptions, path string) error {
	if !strings.HasSuffix(path, ".log") {
		return nil
	}
	base, err := strconv.ParseInt(filepath.Base(strings.TrimSuffix(path, ".log")), 10, 64)
	if err != nil {
		return nil // not a segment name: no index to look for
	}
	idx := strings.TrimSuffix(path, ".log") + ".txnindex"
	if _, err := os.Stat(idx); err != nil {
		return nil
	}
	es, bad, err := log.DumpTxnIndex(log.OSFS, idx, base, -1)
	if err != nil {
		return fmt.Errorf("dump %s: %w", idx, err)
	}
	for _, a := range es {
		if o.json {
			if err := enc.Encode(&dumpAbortedTxn{File: idx, ProducerID: a.ProducerID, FirstOffset: a.FirstOffset, LastOffset: a.LastOffset, LastStableOffset: a.LastStableOffset}); err != nil {
				return err
			}
			continue
		}
		if _, err := fmt.Fprintf(w, "aborted producer %d: offsets %d..%d (ABORT marker at %d), LSO after %d\n", a.ProducerID, a.FirstOffset, a.LastOffset, a.LastOffset, a.LastStableOffset); err != nil {
			return err
		}
	}
	if bad != "" && !o.json {
		fmt.Fprintf(w, "# %s: %s\n", idx, bad)
	}
	return nil
}
