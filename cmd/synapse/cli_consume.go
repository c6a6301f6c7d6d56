package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"slices"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
)

// `synapse consume TOPIC...`: records to stdout, kcat style.

// offsetSpec is a position in a partition as the flags give it.
type offsetSpec struct {
	kind byte // 's' log start, 'e' end, 'a' absolute, 'r' n before the end, 't' first at or after the timestamp n (ms)
	n    int64
}

func (s offsetSpec) String() string {
	switch s.kind {
	case 's':
		return "start"
	case 'e':
		return "end"
	case 'r':
		return "-" + strconv.FormatInt(s.n, 10)
	case 't':
		return "@" + strconv.FormatInt(s.n, 10)
	}
	return strconv.FormatInt(s.n, 10)
}

// parseOffsetSpec parses start|beginning, end, N, -N (N before the end)
// and @TS or s@TS (the first record at or after Unix ms TS).
func parseOffsetSpec(s string) (offsetSpec, error) {
	switch strings.ToLower(s) {
	case "start", "beginning", "oldest", "s":
		return offsetSpec{kind: 's'}, nil
	case "end", "latest", "newest", "e":
		return offsetSpec{kind: 'e'}, nil
	}
	if ts, ok := strings.CutPrefix(s, "s@"); ok {
		s = "@" + ts
	}
	if ts, ok := strings.CutPrefix(s, "@"); ok {
		n, err := strconv.ParseInt(ts, 10, 64)
		if err != nil || n < 0 {
			return offsetSpec{}, fmt.Errorf("%q: want @<Unix milliseconds>", s)
		}
		return offsetSpec{kind: 't', n: n}, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return offsetSpec{}, fmt.Errorf("%q: want start, end, an offset N, -N (N before the end) or @<Unix ms>", s)
	}
	if n < 0 {
		return offsetSpec{kind: 'r', n: -n}, nil
	}
	return offsetSpec{kind: 'a', n: n}, nil
}

// kgoOffset is s as a kgo reset offset (group consumers without commits).
func (s offsetSpec) kgoOffset() kgo.Offset {
	switch s.kind {
	case 's':
		return kgo.NewOffset().AtStart()
	case 'e':
		return kgo.NewOffset().AtEnd()
	case 'r':
		return kgo.NewOffset().AtEnd().Relative(-s.n)
	case 't':
		return kgo.NewOffset().AfterMilli(s.n)
	}
	return kgo.NewOffset().At(s.n)
}

// offsetResolver turns offset specs into offsets of partitions, with the
// log start and end offsets of topics listed once.
type offsetResolver struct {
	adm          *kadm.Client
	starts, ends kadm.ListedOffsets
	byTime       map[int64]kadm.ListedOffsets
}

func newOffsetResolver(ctx context.Context, adm *kadm.Client, topics []string) (*offsetResolver, error) {
	r := &offsetResolver{adm: adm, byTime: map[int64]kadm.ListedOffsets{}}
	var err error
	if r.ends, err = adm.ListEndOffsets(ctx, topics...); err != nil {
		return nil, err
	}
	if r.starts, err = adm.ListStartOffsets(ctx, topics...); err != nil {
		return nil, err
	}
	for _, t := range topics {
		if len(r.ends[t]) == 0 {
			return nil, fmt.Errorf("topic %s: %w", t, kerr.UnknownTopicOrPartition)
		}
		for _, lo := range [...]kadm.ListedOffsets{r.ends, r.starts} {
			for _, o := range lo[t] {
				if o.Err != nil {
					return nil, fmt.Errorf("topic %s partition %d: %w", t, o.Partition, o.Err)
				}
			}
		}
	}
	return r, nil
}

// partitions are topic's partitions in order.
func (r *offsetResolver) partitions(topic string) []int32 {
	var ps []int32
	for p := range r.ends[topic] {
		ps = append(ps, p)
	}
	slices.Sort(ps)
	return ps
}

func (r *offsetResolver) resolve(ctx context.Context, s offsetSpec, topic string, p int32) (int64, error) {
	start, end := r.starts[topic][p].Offset, r.ends[topic][p].Offset
	switch s.kind {
	case 's':
		return start, nil
	case 'e':
		return end, nil
	case 'r':
		return max(end-s.n, start), nil
	case 't':
		lo, ok := r.byTime[s.n]
		if !ok {
			var err error
			if lo, err = r.adm.ListOffsetsAfterMilli(ctx, s.n, sortedKeys(r.ends)...); err != nil {
				return 0, err
			}
			r.byTime[s.n] = lo
		}
		o, ok := lo.Lookup(topic, p)
		if !ok || o.Err != nil {
			return 0, fmt.Errorf("topic %s partition %d: offset for timestamp %d: %w", topic, p, s.n, cmpErr(o.Err, kerr.UnknownTopicOrPartition))
		}
		if o.Offset < 0 {
			return end, nil
		}
		return o.Offset, nil
	}
	return min(max(s.n, start), end), nil
}

func cmpErr(err, or error) error {
	if err != nil {
		return err
	}
	return or
}

type consumeOptions struct {
	cli        cliOptions
	offsets    []string
	to         string
	exitAtEnd  bool
	count      int
	partitions []int32
	group      string
	format     string
}

func newConsumeCommand() *cobra.Command {
	o := &consumeOptions{}
	cmd := &cobra.Command{
		Use:   "consume TOPIC...",
		Short: "Print records of topics (kcat style formats, offsets and timestamps, groups)",
		Long: `Print the records of topics to stdout: by default each value and a newline;
-f sets a format as kcat's and rpk's -f do:

  %t topic   %p partition   %o offset   %k key   %v (or %s) value
  %h headers (k=v,k=v)   %T timestamp (Unix ms)   %K key length
  %S value length   %% percent; escapes \n \r \t \0 \\

--format json prints one JSON object a line instead (key and value as text,
or key_base64/value_base64 when they are not UTF-8).

Where to start (-o): start (the default), end, N (offset N), -N (N before
the end of each partition), @TS or s@TS (the first record at or after Unix
ms TS). Where to stop: --to end (the end when the command started), --to N
(before offset N), --to @TS (before the first record at or after TS); -o
e@TS is --to @TS; -e is --to end (kcat's -e). -n stops after that many
records. Without a bound the command runs until interrupted, and exits 0.

With -g the records are consumed as member GROUP of a consumer group, from
its committed offsets (-o only where it has none) and the records printed
are committed; -e and --to then assume this is the group's only member.
Transaction markers are read (so --to end is reached) but never printed.

` + cliExitCodes,
		Example: `  synapse consume orders -e
  synapse consume orders -o -10 -e -f '%p/%o %k=%v %h\n'
  synapse consume orders -o s@1700000000000 -o e@1700003600000 --format json
  synapse consume orders -g billing -n 100`,
		Args: nArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, topics []string) error {
			return runConsumeCLI(cmd, o, topics)
		},
	}
	fs := cmd.Flags()
	fs.StringArrayVarP(&o.offsets, "offset", "o", nil, "where to start: start, end, N, -N, @TS or s@TS; e@TS where to stop (default start)")
	fs.StringVar(&o.to, "to", "", "where to stop: end, N (exclusive) or @TS")
	fs.BoolVarP(&o.exitAtEnd, "exit", "e", false, "exit at the end of every partition (--to end)")
	fs.IntVarP(&o.count, "num", "n", 0, "exit after this many records (0: no bound)")
	fs.Int32SliceVarP(&o.partitions, "partitions", "p", nil, "only these partitions (comma separated; not with -g)")
	fs.StringVarP(&o.group, "group", "g", "", "consume as a member of this consumer group, committing what is printed")
	fs.StringVarP(&o.format, "record-format", "f", `%v\n`, "output format of each record (not with --format json)")
	o.cli.addFlags(fs)
	return cmd
}

// consumePlan is where each partition starts and stops (-1: no stop).
type consumePlan struct {
	start, stop map[string]map[int32]int64
}

func (o *consumeOptions) specs(fs interface{ Changed(string) bool }) (start offsetSpec, stop *offsetSpec, err error) {
	start = offsetSpec{kind: 's'}
	starts := 0
	for _, s := range o.offsets {
		if ts, ok := strings.CutPrefix(s, "e@"); ok {
			if stop != nil {
				return start, nil, usageErrorf("-o %s: a second place to stop", s)
			}
			sp, err := parseOffsetSpec("@" + ts)
			if err != nil {
				return start, nil, usageErrorf("-o: %w", err)
			}
			stop = &sp
			continue
		}
		if starts++; starts > 1 {
			return start, nil, usageErrorf("-o %s: a second place to start", s)
		}
		if start, err = parseOffsetSpec(s); err != nil {
			return start, nil, usageErrorf("-o: %w", err)
		}
	}
	if o.to != "" || o.exitAtEnd {
		if stop != nil || o.to != "" && o.exitAtEnd {
			return start, nil, usageErrorf("give one place to stop: -e, --to or -o e@TS")
		}
		to := o.to
		if o.exitAtEnd {
			to = "end"
		}
		sp, err := parseOffsetSpec(to)
		if err != nil || sp.kind == 'r' || sp.kind == 's' {
			return start, nil, usageErrorf("--to %q: end, an offset N or @<Unix ms>", o.to)
		}
		stop = &sp
	}
	if o.count < 0 {
		return start, nil, usageErrorf("-n %d: must not be negative", o.count)
	}
	if o.group != "" && len(o.partitions) > 0 {
		return start, nil, usageErrorf("-p picks partitions, -g lets the group assign them: give one")
	}
	if fs.Changed("record-format") && o.cli.json() {
		return start, nil, usageErrorf("-f and --format json both say how to print records: give one")
	}
	return start, stop, nil
}

func runConsumeCLI(cmd *cobra.Command, o *consumeOptions, topics []string) error {
	if err := o.cli.validate(); err != nil {
		return err
	}
	startSpec, stopSpec, err := o.specs(cmd.Flags())
	if err != nil {
		return err
	}
	toks, err := parseRecordFormat(o.format, outputVerbs)
	if err != nil {
		return usageErrorf("-f: %w", err)
	}
	slices.Sort(topics)
	topics = slices.Compact(topics)

	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The admin client works out the plan within --timeout.
	acl, adm, err := o.cli.client()
	if err != nil {
		return err
	}
	defer acl.Close()
	sctx, cancel := context.WithTimeout(ctx, o.cli.timeout)
	defer cancel()
	res, err := newOffsetResolver(sctx, adm, topics)
	if err != nil {
		return o.cli.explain(err)
	}
	var committed kadm.OffsetResponses
	if o.group != "" {
		if committed, err = adm.FetchOffsetsForTopics(sctx, o.group, topics...); err != nil {
			return o.cli.explain(err)
		}
	}
	plan := consumePlan{start: map[string]map[int32]int64{}, stop: map[string]map[int32]int64{}}
	for _, t := range topics {
		plan.start[t], plan.stop[t] = map[int32]int64{}, map[int32]int64{}
		for _, p := range res.partitions(t) {
			if len(o.partitions) > 0 && !slices.Contains(o.partitions, p) {
				continue
			}
			at := int64(-1)
			if c, ok := committed.Lookup(t, p); ok && c.Err == nil && c.At >= 0 {
				at = c.At
			} else if at, err = res.resolve(sctx, startSpec, t, p); err != nil {
				return o.cli.explain(err)
			}
			plan.start[t][p], plan.stop[t][p] = at, -1
			if stopSpec != nil {
				if plan.stop[t][p], err = res.resolve(sctx, *stopSpec, t, p); err != nil {
					return o.cli.explain(err)
				}
			}
		}
		for _, p := range o.partitions {
			if _, ok := plan.start[t][p]; !ok {
				return fmt.Errorf("topic %s has no partition %d: %w", t, p, kerr.UnknownTopicOrPartition)
			}
		}
	}
	cancel()

	// Partitions still to read up to their stop.
	open := map[string]map[int32]bool{}
	nOpen := 0
	for t, ps := range plan.start {
		open[t] = map[int32]bool{}
		for p, at := range ps {
			if s := plan.stop[t][p]; s < 0 || at < s {
				open[t][p] = true
				nOpen++
			}
		}
	}
	if nOpen == 0 {
		return nil
	}
	// Control records (transaction markers) are seen, not printed: a stop
	// at the log end is often a marker's offset.
	opts := []kgo.Opt{kgo.KeepControlRecords()}
	if o.group != "" {
		opts = append(opts, kgo.ConsumerGroup(o.group), kgo.ConsumeTopics(topics...),
			kgo.ConsumeResetOffset(startSpec.kgoOffset()), kgo.AutoCommitMarks())
	} else {
		parts := map[string]map[int32]kgo.Offset{}
		for t, ps := range open {
			parts[t] = map[int32]kgo.Offset{}
			for p := range ps {
				parts[t][p] = kgo.NewOffset().At(plan.start[t][p])
			}
		}
		opts = append(opts, kgo.ConsumePartitions(parts))
	}
	cl, _, err := o.cli.client(opts...)
	if err != nil {
		return err
	}
	defer cl.Close()

	w := bufio.NewWriterSize(cmd.OutOrStdout(), 64<<10)
	defer w.Flush()
	var buf []byte
	printed := 0
	runErr := func() error {
		for nOpen > 0 && (o.count == 0 || printed < o.count) {
			fetches := cl.PollFetches(ctx)
			if ctx.Err() != nil {
				return nil // interrupted: a normal end
			}
			var fetchErr error
			fetches.EachError(func(t string, p int32, err error) {
				if !errors.Is(err, context.Canceled) && fetchErr == nil {
					fetchErr = fmt.Errorf("topic %s partition %d: %w", t, p, err)
				}
			})
			if fetchErr != nil {
				return fetchErr
			}
			pause := map[string][]int32{}
			fetches.EachRecord(func(r *kgo.Record) {
				if !open[r.Topic][r.Partition] || o.count > 0 && printed >= o.count {
					return
				}
				stop := plan.stop[r.Topic][r.Partition]
				if stop >= 0 && r.Offset >= stop {
					delete(open[r.Topic], r.Partition)
					nOpen--
					pause[r.Topic] = append(pause[r.Topic], r.Partition)
					return
				}
				if r.Attrs.IsControl() {
					if o.group != "" {
						cl.MarkCommitRecords(r) // the group's position moves past it
					}
				} else if o.cli.json() {
					b, _ := json.Marshal(toJSONRecord(r))
					buf = append(buf[:0], b...)
					buf = append(buf, '\n')
					w.Write(buf)
				} else {
					buf = appendRecord(buf[:0], toks, r)
					w.Write(buf)
				}
				if !r.Attrs.IsControl() {
					printed++
					if o.group != "" {
						cl.MarkCommitRecords(r)
					}
				}
				if stop >= 0 && r.Offset+1 >= stop {
					delete(open[r.Topic], r.Partition)
					nOpen--
					pause[r.Topic] = append(pause[r.Topic], r.Partition)
				}
			})
			if len(pause) > 0 {
				cl.PauseFetchPartitions(pause)
			}
			if err := w.Flush(); err != nil {
				return err
			}
		}
		return nil
	}()
	if o.group != "" {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), o.cli.timeout)
		defer cancel()
		if err := cl.CommitMarkedOffsets(cctx); err != nil && runErr == nil {
			runErr = fmt.Errorf("committing the offsets of group %s: %w", o.group, err)
		}
		cl.LeaveGroupContext(cctx)
	}
	return runErr
}
