package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kgo"
)

// `synapse produce TOPIC`: records from stdin, one a line by default.

type produceOptions struct {
	cli         cliOptions
	key         string
	keyDelim    string
	delim       string
	format      string
	headers     []string
	partition   int32
	acks        string
	compression string
	quiet       bool
}

type producedRecord struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Offset    int64  `json:"offset"`
	Timestamp int64  `json:"timestamp"`
	Error     string `json:"error,omitempty"`
}

func newProduceCommand() *cobra.Command {
	o := &produceOptions{}
	cmd := &cobra.Command{
		Use:   "produce TOPIC",
		Short: "Produce records read from stdin (one a line by default)",
		Long: `Produce records read from stdin to TOPIC: by default each line is a value.
-K splits each record into key and value at its first delimiter (kcat's -K),
-D sets the record delimiter, -f reads a format as rpk's -f does:

  %k key   %v value   %p partition   %T timestamp (Unix ms)   %% percent
  escapes \n \r \t \0 \\; fields need literal text between them.

Each acknowledged record is printed with its partition and offset (--format
json: one JSON object a line; -q: nothing). The command fails (exit 1) if
any record was not produced.

` + cliExitCodes,
		Example: `  echo hello | synapse produce orders
  printf 'k1:v1\nk2:v2\n' | synapse produce orders -K:
  printf 'k1 v1\n' | synapse produce orders -f '%k %v\n' -H source=cli
  synapse produce orders -k user-1 -p 0 --acks 1 < values.txt`,
		Args: nArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runProduceCLI(cmd, o, args[0])
		},
	}
	fs := cmd.Flags()
	fs.StringVarP(&o.key, "key", "k", "", "key of every record")
	fs.StringVarP(&o.keyDelim, "key-delimiter", "K", "", "split each record into key and value at the first of this text")
	fs.StringVarP(&o.delim, "delimiter", "D", `\n`, "text between records")
	fs.StringVarP(&o.format, "record-format", "f", "", "input format, e.g. '%k %v\\n' (replaces -K and -D)")
	fs.StringArrayVarP(&o.headers, "header", "H", nil, "header key=value of every record (repeatable)")
	fs.Int32VarP(&o.partition, "partition", "p", -1, "partition to produce to (-1: by key hash, or spread when there is no key)")
	fs.StringVar(&o.acks, "acks", "all", "acknowledgement: all, 1 or 0 (0: no offsets known)")
	fs.StringVarP(&o.compression, "compression", "z", "none", "none, gzip, snappy, lz4 or zstd")
	fs.BoolVarP(&o.quiet, "quiet", "q", false, "print nothing for records produced (failures still go to stderr)")
	o.cli.addFlags(fs)
	return cmd
}

func (o *produceOptions) recordFormat(fs interface{ Changed(string) bool }) ([]fmtToken, error) {
	if o.format != "" {
		if o.keyDelim != "" || fs.Changed("delimiter") {
			return nil, usageErrorf("-f replaces -K and -D: give one or the other")
		}
		toks, err := parseRecordFormat(o.format, inputVerbs)
		if err != nil {
			return nil, usageErrorf("-f: %w", err)
		}
		return toks, nil
	}
	delim, err := unescape(o.delim)
	if err != nil || delim == "" {
		return nil, usageErrorf("-D %q: want a non-empty delimiter (%v)", o.delim, err)
	}
	return []fmtToken{{verb: 'v'}, {lit: []byte(delim)}}, nil
}

// keyDelimiter is -K unescaped (nil: none).
func (o *produceOptions) keyDelimiter() ([]byte, error) {
	if o.keyDelim == "" {
		return nil, nil
	}
	kd, err := unescape(o.keyDelim)
	if err != nil {
		return nil, usageErrorf("-K: %w", err)
	}
	return []byte(kd), nil
}

func runProduceCLI(cmd *cobra.Command, o *produceOptions, topic string) error {
	toks, err := o.recordFormat(cmd.Flags())
	if err != nil {
		return err
	}
	keyDelim, err := o.keyDelimiter()
	if err != nil {
		return err
	}
	keyed := keyDelim != nil
	for _, t := range toks {
		keyed = keyed || t.verb == 'k'
	}
	if keyed && cmd.Flags().Changed("key") {
		return usageErrorf("-k gives every record the same key; the input format reads keys too: give one")
	}
	hdrs, order, err := parseKVs(o.headers, "-H")
	if err != nil {
		return err
	}
	if o.partition < -1 {
		return usageErrorf("-p %d: a partition number, or -1", o.partition)
	}
	codec, err := compressionCodec(o.compression)
	if err != nil {
		return usageError{err}
	}
	opts := []kgo.Opt{kgo.DefaultProduceTopic(topic), kgo.ProducerBatchCompression(codec),
		// Not RecordDeliveryTimeout: kgo measures it from the record's
		// timestamp, which %T may set in the past.
		kgo.RecordRetries(20), kgo.ProduceRequestTimeout(min(o.cli.timeout, 30*time.Second)),
		kgo.RecordPartitioner(partitionOr(kgo.StickyKeyPartitioner(nil))), kgo.UnknownTopicRetries(3),
		kgo.AllowAutoTopicCreation()} // the broker's --auto-create-topics decides
	switch o.acks {
	case "all", "-1":
		opts = append(opts, kgo.RequiredAcks(kgo.AllISRAcks()))
	case "1":
		opts = append(opts, kgo.RequiredAcks(kgo.LeaderAck()), kgo.DisableIdempotentWrite())
	case "0":
		opts = append(opts, kgo.RequiredAcks(kgo.NoAck()), kgo.DisableIdempotentWrite())
	default:
		return usageErrorf("--acks %q: all, 1 or 0", o.acks)
	}
	in, err := newRecordReader(cmd.InOrStdin(), toks)
	if err != nil {
		return usageErrorf("-f: %w", err)
	}
	cl, _, err := o.cli.client(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	var (
		mu       sync.Mutex
		failed   int
		total    int
		firstErr error
		w        = cmd.OutOrStdout()
		ew       = cmd.ErrOrStderr()
	)
	var pending sync.WaitGroup // records given to the client, not yet reported
	report := func(r *kgo.Record, err error) {
		defer pending.Done()
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			failed++
			if firstErr == nil {
				firstErr = err
			}
			fmt.Fprintf(ew, "record not produced (key %q): %v\n", r.Key, o.cli.explain(err))
		}
		if o.quiet && err == nil {
			return
		}
		if o.cli.json() {
			b, _ := json.Marshal(producedRecord{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset,
				Timestamp: r.Timestamp.UnixMilli(), Error: errString(err)})
			w.Write(append(b, '\n'))
		} else if err == nil {
			if o.acks == "0" {
				fmt.Fprintf(w, "Produced to %s partition %d (acks=0: offset unknown)\n", r.Topic, r.Partition)
			} else {
				fmt.Fprintf(w, "Produced to %s partition %d at offset %d with timestamp %d\n", r.Topic, r.Partition, r.Offset, r.Timestamp.UnixMilli())
			}
		}
	}
	// stdin is read beside, so that an interrupt ends a terminal's input
	// too: what was read by then is still delivered.
	type read struct {
		rec *kgo.Record
		err error
	}
	reads := make(chan read)
	go func() {
		for {
			rec, err := in.next()
			select {
			case reads <- read{rec, err}:
			case <-ctx.Done():
				return
			}
			if err != nil {
				return
			}
		}
	}()
	var readErr error
	pctx := context.WithoutCancel(ctx)
loop:
	for {
		var r read
		select {
		case <-ctx.Done():
			break loop
		case r = <-reads:
		}
		if r.err == io.EOF {
			break
		}
		if r.err != nil {
			readErr = r.err
			break
		}
		rec := r.rec
		if keyDelim != nil {
			// kcat's -K: a record without the delimiter has no key.
			if k, v, ok := bytes.Cut(rec.Value, keyDelim); ok {
				rec.Key, rec.Value = k, v
			}
		}
		if cmd.Flags().Changed("key") {
			rec.Key = []byte(o.key)
		}
		if rec.Partition < 0 {
			rec.Partition = o.partition
		}
		for _, k := range order {
			rec.Headers = append(rec.Headers, kgo.RecordHeader{Key: k, Value: []byte(hdrs[k])})
		}
		mu.Lock()
		total++
		mu.Unlock()
		pending.Add(1)
		cl.Produce(pctx, rec, report)
	}
	// Whatever was given to the client is delivered within --timeout of
	// the end of the input, or fails (Close fails what is still buffered).
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.cli.timeout)
	defer cancel()
	if err := cl.Flush(fctx); err != nil {
		cl.Close()
	}
	// Close fails what was buffered, reporting it from another goroutine:
	// every record is counted before the exit status is decided.
	pending.Wait()
	mu.Lock()
	defer mu.Unlock()
	if readErr != nil {
		return fmt.Errorf("reading stdin: %w (%d records before it were given to the broker, %d of them failed)", readErr, total, failed)
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d records not produced: %w", failed, total, o.cli.explain(firstErr))
	}
	return nil
}

// partitionOr sends records with a partition (>= 0) there, others by p.
func partitionOr(p kgo.Partitioner) kgo.Partitioner { return manualOr{p} }

type manualOr struct{ p kgo.Partitioner }

func (m manualOr) ForTopic(t string) kgo.TopicPartitioner {
	return manualOrTopic{m.p.ForTopic(t)}
}

type manualOrTopic struct{ tp kgo.TopicPartitioner }

func (m manualOrTopic) RequiresConsistency(r *kgo.Record) bool {
	return r.Partition >= 0 || m.tp.RequiresConsistency(r)
}

// Partition returns a given partition as is: kgo fails a record whose
// partition does not exist.
func (m manualOrTopic) Partition(r *kgo.Record, n int) int {
	if r.Partition >= 0 {
		return int(r.Partition)
	}
	return m.tp.Partition(r, n)
}

// OnNewBatch keeps the sticky partitioner's moves for records without key.
func (m manualOrTopic) OnNewBatch() {
	if nb, ok := m.tp.(kgo.TopicPartitionerOnNewBatch); ok {
		nb.OnNewBatch()
	}
}
