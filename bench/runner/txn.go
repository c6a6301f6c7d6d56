package main

// The transactions block (issue 17): Synapse and kfake, fresh brokers in
// turn, A B B A over -txn-rounds rounds, the same client (`synapse bench
// produce --transactional-id`, `synapse bench consume --isolation`):
//
//   - TX1: produce -txn-records records of 1 KiB (acks=all) idempotent and
//     transactional (-txn-per-txn records per transaction, each producer
//     client with a transactional id of its own, committing each), for
//     each producer count of -txn-producers (n producers on a topic of n
//     partitions). Within a slot the two variants run in halves, A B B A
//     (reversed in odd rounds); a variant's figure is its bytes over its
//     time across its halves.
//   - TX2: -txn-read-producers transactional producers write -txn-records
//     records to one partition, every -txn-abort-every-th transaction
//     aborted; then the topic is read from 0 to its end read_uncommitted
//     and read_committed, -txn-read-passes times each (A B, B A, ...;
//     reversed in odd rounds). Both read the same log to the same end
//     (the read_committed consumer skips the aborted records, the broker
//     still sends them with their AbortedTransactions ranges), so the
//     figure is MB/s of the topic: its bytes, aborted ones included, over
//     the time to read it to its end. Each read is checked: read_uncommitted
//     gets every record, read_committed exactly the committed ones.
//
// A part that fails (e.g. a broker that refuses transactional producers)
// is reported and skipped; the block goes on.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

type txnOptions struct {
	rounds        int // < 0: as -rounds; 0: no transactions block
	only          bool
	records       int64
	perTxn        int
	producers     []int
	readProducers int
	abortEvery    int
	readPasses    int
	kfake         bool
}

// txnFlags registers the transactions block's flags.
func txnFlags(o *txnOptions) {
	o.producers = []int{1, 4}
	flag.IntVar(&o.rounds, "txn-rounds", -1, "rounds of the transactions block, TX1 and TX2 (-1: as -rounds; 0: skip it)")
	flag.BoolVar(&o.only, "txn-only", false, "run only the transactions block")
	flag.Int64Var(&o.records, "txn-records", 500_000, "records (1 KiB) of each TX1 produce variant and of TX2's topic")
	flag.IntVar(&o.perTxn, "txn-per-txn", 100, "records per transaction")
	flag.Func("txn-producers", "TX1's producer counts, comma separated: n producers on a topic of n partitions (default 1,4)", func(s string) error {
		o.producers = nil
		for f := range strings.SplitSeq(s, ",") {
			if f = strings.TrimSpace(f); f == "" {
				continue
			}
			n, err := strconv.Atoi(f)
			if err != nil || n <= 0 {
				return fmt.Errorf("bad producer count %q", f)
			}
			o.producers = append(o.producers, n)
		}
		return nil
	})
	flag.IntVar(&o.readProducers, "txn-read-producers", 4, "transactional producers writing TX2's topic (one partition, their transactions interleaved)")
	flag.IntVar(&o.abortEvery, "txn-abort-every", 10, "TX2's topic: every K-th transaction aborts (10: 10% aborted)")
	flag.IntVar(&o.readPasses, "txn-read-passes", 3, "TX2: reads of the topic per isolation level and slot, in rotating order (A B, B A, A B, ...)")
	flag.BoolVar(&o.kfake, "txn-kfake", true, "also kfake in the transactions block")
}

func (o txnOptions) aborted() string {
	if o.abortEvery <= 0 {
		return "no transaction aborted"
	}
	return fmt.Sprintf("1 transaction in %d aborted", o.abortEvery)
}

// Transactions metric names.
func tx1Produce(kind string, n int) string {
	return fmt.Sprintf("TX1 %s produce MB/s (%s)", kind, producers(n))
}
func tx1CPU(kind string, n int) string {
	return fmt.Sprintf("TX1 %s produce broker CPU ms/MB (%s)", kind, producers(n))
}
func tx1Txn(q string, n int) string {
	return fmt.Sprintf("TX1 transaction %s ms (%s)", q, producers(n))
}

func producers(n int) string {
	if n == 1 {
		return "1 producer"
	}
	return fmt.Sprintf("%d producers, %d partitions", n, n)
}

const (
	tx2Prepare  = "TX2 prepare: transactional produce MB/s"
	tx2Consume  = "TX2 consume MB/s of the topic " // + isolation
	tx2CPU      = "TX2 consume broker CPU ms/MB "  // + isolation
	uncommitted = "read_uncommitted"
	committed   = "read_committed"
)

// txnKey is a sample of the transactions block, kept per round so that
// ratios pair figures of the same round even when a part failed.
type txnKey struct {
	metric, broker string
	round          int
}

func (r *runner) txnAdd(round int, metric, broker string, v float64) {
	r.add(metric, broker, v)
	if r.txnVals == nil {
		r.txnVals = map[txnKey]float64{}
	}
	r.txnVals[txnKey{metric, broker, round}] = v
}

// txnBlock runs the transactions block: each round Synapse and kfake in
// turn, in alternating order.
func (r *runner) txnBlock() error {
	syn, kf, _, _ := r.targets()
	for round := 0; round < r.o.txn.rounds; round++ {
		order := []target{syn}
		if r.o.txn.kfake {
			order = append(order, kf)
			if round%2 == 1 {
				slices.Reverse(order)
			}
		}
		fmt.Fprintf(os.Stderr, "transactions round %d/%d: %s\n", round+1, r.o.txn.rounds, strings.Join(names(order), ", "))
		for _, t := range order {
			if err := r.txnSlot(t, round); err != nil {
				return fmt.Errorf("transactions, %s: %w", t.name, err)
			}
		}
	}
	return nil
}

func names(ts []target) []string {
	var s []string
	for _, t := range ts {
		s = append(s, t.name)
	}
	return s
}

// txnFailed notes a part of the block that failed; the block goes on.
func (r *runner) txnFailed(round int, broker, part string, err error) {
	msg := fmt.Sprintf("round %d, %s, %s: %s", round+1, broker, part, strings.TrimSpace(err.Error()))
	fmt.Fprintln(os.Stderr, "  failed:", msg)
	r.txnFailures = append(r.txnFailures, msg)
}

// txnSlot: TX1 for each producer count, then TX2, on a fresh broker.
func (r *runner) txnSlot(t target, round int) error {
	b, _, err := fresh(t)
	if err != nil {
		return err
	}
	defer b.done()
	rev := round%2 == 1
	o := r.o.txn
	perTxn := strconv.Itoa(o.perTxn)
	half := strconv.FormatInt(max(o.records/2, 1), 10)
	for _, n := range o.producers {
		kinds := []string{"idempotent", "transactional"}
		var acc [2]sums
		var failed [2]bool
		var txnP50, txnP99 []float64
		for slice, i := range schedule(2, 2, rev) {
			if failed[i] {
				continue
			}
			args := []string{"produce", "--topic", fmt.Sprintf("tx1-%s-%d", kinds[i], n), "--partitions", strconv.Itoa(n),
				"--producers", strconv.Itoa(n), "--records", half, "--record-size", "1024", "--acks", "all", "--idempotent"}
			if i == 1 {
				args = append(args, "--transactional-id", fmt.Sprintf("tx1-%d-%d", n, slice), "--txn-records", perTxn)
			}
			res, c, err := r.client(b, args...)
			if err == nil && i == 1 && (res.CommittedRecords != res.Records || res.AbortedTransactions != 0) {
				err = fmt.Errorf("%d records acknowledged, %d committed, %d transactions aborted", res.Records, res.CommittedRecords, res.AbortedTransactions)
			}
			if err != nil {
				failed[i] = true
				r.txnFailed(round, t.name, fmt.Sprintf("TX1 %s produce, %s", kinds[i], producers(n)), err)
				continue
			}
			if i == 1 {
				txnP50, txnP99 = append(txnP50, res.TxnLatencyMs["p50"]), append(txnP99, res.TxnLatencyMs["p99"])
			}
			acc[i].add(res, c)
		}
		for i, k := range kinds {
			if !failed[i] {
				r.txnAdd(round, tx1Produce(k, n), t.name, acc[i].mbPerSec())
				r.txnAdd(round, tx1CPU(k, n), t.name, msPerMB(acc[i].cpu, acc[i].bytes))
			}
		}
		if !failed[1] {
			r.txnAdd(round, tx1Txn("p50", n), t.name, median(txnP50))
			r.txnAdd(round, tx1Txn("p99", n), t.name, slices.Max(txnP99))
		}
	}
	if err := r.tx2(b, round, rev); err != nil {
		r.txnFailed(round, t.name, "TX2", err)
	}
	return nil
}

// consumeBound bounds each of TX2's reads (a few seconds when all is
// well): a broker that never lets a read_committed consumer reach the end
// fails the part instead of holding the block for the client's default
// 5 minutes.
const consumeBound = 2 * time.Minute

// tx2 prepares TX2's topic on b and reads it both ways.
func (r *runner) tx2(b *broker, round int, rev bool) error {
	o := r.o.txn
	n := b.t.name
	prep, _, err := r.client(b, "produce", "--topic", "tx2", "--partitions", "1", "--producers", strconv.Itoa(o.readProducers),
		"--records", strconv.FormatInt(o.records, 10), "--record-size", "1024", "--acks", "all", "--idempotent",
		"--transactional-id", "tx2", "--txn-records", strconv.Itoa(o.perTxn), "--abort-every", strconv.Itoa(o.abortEvery))
	if err != nil {
		return fmt.Errorf("prepare: %w", err)
	}
	if prep.CommittedRecords+prep.AbortedRecords != prep.Records {
		return fmt.Errorf("prepare: %d records acknowledged, %d committed + %d aborted", prep.Records, prep.CommittedRecords, prep.AbortedRecords)
	}
	r.txnAdd(round, tx2Prepare, n, prep.MBPerSec)
	levels := []string{uncommitted, committed}
	want := []int64{prep.Records, prep.CommittedRecords}
	var acc [2]sums
	var failed [2]error
	for _, i := range schedule(2, o.readPasses, rev) {
		if failed[i] != nil {
			continue
		}
		res, c, err := r.client(b, "consume", "--topic", "tx2", "--isolation", levels[i], "--duration", consumeBound.String())
		if err == nil && res.Records != want[i] {
			err = fmt.Errorf("%d records, want %d (%d produced, %d of them in %d aborted transactions of %d)",
				res.Records, want[i], prep.Records, prep.AbortedRecords, prep.AbortedTransactions, prep.Transactions)
		}
		if err != nil {
			failed[i] = fmt.Errorf("consume %s: %w", levels[i], err)
			continue
		}
		res.Bytes = prep.Bytes // the topic's bytes, read to its end either way
		acc[i].add(res, c)
	}
	for i, l := range levels {
		if failed[i] == nil {
			r.txnAdd(round, tx2Consume+l, n, acc[i].mbPerSec())
			r.txnAdd(round, tx2CPU+l, n, msPerMB(acc[i].cpu, acc[i].bytes))
		}
	}
	return errors.Join(failed[0], failed[1])
}

// txnRow is a row of the transactions table: a variant against its
// baseline, each a metric of a broker.
type txnRow struct {
	text                   string
	base, baseBroker       string
	variant, variantBroker string
	goal                   string
	check                  func(ratio float64) bool
}

func (r *runner) txnRows() []txnRow {
	at := func(min float64) func(float64) bool { return func(q float64) bool { return q >= min } }
	var rows []txnRow
	for _, n := range r.o.txn.producers {
		p := producers(n)
		rows = append(rows,
			txnRow{"TX1 produce MB/s, " + p + ", Synapse: idempotent → transactional", tx1Produce("idempotent", n), "synapse", tx1Produce("transactional", n), "synapse", "≥ 0.8×", at(0.8)},
			txnRow{"TX1 transactional produce MB/s, " + p + ": kfake → Synapse", tx1Produce("transactional", n), "kfake", tx1Produce("transactional", n), "synapse", "≥ 1.0×", at(1.0)},
			txnRow{"  broker CPU ms/MB, Synapse: idempotent → transactional", tx1CPU("idempotent", n), "synapse", tx1CPU("transactional", n), "synapse", "", nil},
			txnRow{"  transaction p50 ms (begin to commit answered): kfake → Synapse", tx1Txn("p50", n), "kfake", tx1Txn("p50", n), "synapse", "", nil},
			txnRow{"  transaction p99 ms (the worse half): kfake → Synapse", tx1Txn("p99", n), "kfake", tx1Txn("p99", n), "synapse", "", nil},
			txnRow{"  reference, kfake: idempotent → transactional", tx1Produce("idempotent", n), "kfake", tx1Produce("transactional", n), "kfake", "", nil},
		)
	}
	rows = append(rows,
		txnRow{fmt.Sprintf("TX2 consume MB/s of the topic (%s), Synapse: read_uncommitted → read_committed", r.o.txn.aborted()),
			tx2Consume + uncommitted, "synapse", tx2Consume + committed, "synapse", "≥ 0.95×", at(0.95)},
		txnRow{"TX2 read_committed consume MB/s: kfake → Synapse", tx2Consume + committed, "kfake", tx2Consume + committed, "synapse", "", nil},
		txnRow{"  broker CPU ms/MB, Synapse: read_uncommitted → read_committed", tx2CPU + uncommitted, "synapse", tx2CPU + committed, "synapse", "", nil},
		txnRow{"  reference, kfake: read_uncommitted → read_committed", tx2Consume + uncommitted, "kfake", tx2Consume + committed, "kfake", "", nil},
		txnRow{"TX2 preparing the topic (transactional produce with aborts) MB/s: kfake → Synapse", tx2Prepare, "kfake", tx2Prepare, "synapse", "", nil},
	)
	if !r.o.txn.kfake {
		rows = slices.DeleteFunc(rows, func(row txnRow) bool { return row.baseBroker == "kfake" || row.variantBroker == "kfake" })
	}
	return rows
}

func (r *runner) reportTxn(w io.Writer) {
	o := r.o.txn
	fmt.Fprintf(w, "\nTransactions (issue 17): a fresh broker per round and broker (A B B A), %d rounds. TX1: %d records of 1 KiB (acks=all) idempotent and transactional (%d records per transaction,\n",
		o.rounds, o.records, o.perTxn)
	fmt.Fprintf(w, "each producer its own transactional id, all committed) in halves run A B B A within the slot; n producers on a topic of n partitions (round-robin). TX2: %d transactional producers write\n", o.readProducers)
	fmt.Fprintf(w, "%d records to one partition, %s; then read from 0 to the end read_uncommitted and read_committed, %d times each in rotating order: MB/s of the topic (aborted records included:\n", o.records, o.aborted(), o.readPasses)
	fmt.Fprintln(w, "both read the same log to the same end). Ratios are medians of the per-round ratios.")
	fmt.Fprintln(w, "\n| workload | baseline median (min–max) | median (min–max) | ratio median (min–max) | goal | met |")
	fmt.Fprintln(w, "|---|---|---|---|---|---|")
	for _, row := range r.txnRows() {
		var ratios []float64
		for round := range o.rounds {
			bv, ok1 := r.txnVals[txnKey{row.base, row.baseBroker, round}]
			v, ok2 := r.txnVals[txnKey{row.variant, row.variantBroker, round}]
			if ok1 && ok2 && bv > 0 {
				ratios = append(ratios, v/bv)
			}
		}
		ratio, met := "—", "—"
		if len(ratios) > 0 {
			ratio = fmt.Sprintf("%.2f× (%.2f–%.2f)", median(ratios), slices.Min(ratios), slices.Max(ratios))
			if row.check != nil {
				met = "no"
				if row.check(median(ratios)) {
					met = "yes"
				}
			}
		}
		goal := row.goal
		if goal == "" {
			goal = "—"
		}
		fmt.Fprintf(w, "| %s | %s | %s | %s | %s | %s |\n", row.text, span(r.samples[row.base][row.baseBroker]), span(r.samples[row.variant][row.variantBroker]), ratio, goal, met)
	}
	for _, f := range r.txnFailures {
		fmt.Fprintf(w, "\nFailed: %s\n", f)
	}
}
