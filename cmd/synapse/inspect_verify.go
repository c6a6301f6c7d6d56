package main

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/synapsebroker/synapse/log"
)

type verifyOptions struct {
	json bool
}

func (o *verifyOptions) AddFlags(fs *pflag.FlagSet) {
	fs.BoolVar(&o.json, "json", false, "print one JSON object per directory instead of text")
}

func newInspectVerifyCommand() *cobra.Command {
	o := &verifyOptions{}
	cmd := &cobra.Command{
		Use:   "verify <partition-dir>...",
		Short: "Check partition directories without changing them",
		Long: `Check every batch of every segment (framing, magic 2, CRC-32C, offset
continuity; gaps only in segments the log cleaner wrote), that segments are contiguous and that index files agree with the
log. Damage is corruption; notes are what the next open repairs without losing
acknowledged data (a torn tail, stale indexes). Exits non-zero if any directory
is damaged or cannot be read.`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return verifyFunc(cmd.OutOrStdout(), o, args)
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}

// verifyResult is one output object of `inspect verify --json`.
type verifyResult struct {
	Dir         string   `json:"dir"`
	OK          bool     `json:"ok"`
	Error       string   `json:"error,omitempty"`
	Segments    int      `json:"segments"`
	Batches     int      `json:"batches"`
	Bytes       int64    `json:"bytes"`
	FirstOffset int64    `json:"firstOffset"`
	NextOffset  int64    `json:"nextOffset"`
	Damage      []string `json:"damage"`
	Notes       []string `json:"notes"`
}

func verifyFunc(w io.Writer, o *verifyOptions, dirs []string) error {
	enc := json.NewEncoder(w)
	var bad []string
	for _, dir := range dirs {
		res := verifyResult{Dir: dir, Damage: []string{}, Notes: []string{}}
		rep, err := log.VerifyDir(log.OSFS, dir)
		if err != nil {
			res.Error = err.Error()
		} else {
			res.OK = rep.OK()
			res.Segments, res.Batches, res.Bytes = rep.Segments, rep.Batches, rep.Bytes
			res.FirstOffset, res.NextOffset = rep.FirstOffset, rep.NextOffset
			res.Damage = append(res.Damage, rep.Damage...)
			res.Notes = append(res.Notes, rep.Notes...)
		}
		if !res.OK {
			bad = append(bad, dir)
		}
		if o.json {
			if err := enc.Encode(&res); err != nil {
				return err
			}
			continue
		}
		if err := writeVerifyText(w, &res); err != nil {
			return err
		}
	}
	if len(bad) > 0 {
		return fmt.Errorf("%d of %d partition directories damaged or unreadable: %s",
			len(bad), len(dirs), strings.Join(bad, ", "))
	}
	return nil
}

func writeVerifyText(w io.Writer, r *verifyResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n", r.Dir)
	if r.Error != "" {
		fmt.Fprintf(&b, "  error: %s\n", r.Error)
	} else {
		offsets := "none"
		if r.NextOffset > r.FirstOffset {
			offsets = fmt.Sprintf("%d..%d", r.FirstOffset, r.NextOffset-1)
		}
		fmt.Fprintf(&b, "  segments=%d batches=%d bytes=%d offsets=%s firstOffset=%d nextOffset=%d\n",
			r.Segments, r.Batches, r.Bytes, offsets, r.FirstOffset, r.NextOffset)
	}
	for _, d := range r.Damage {
		fmt.Fprintf(&b, "  damage: %s\n", d)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "  note: %s\n", n)
	}
	status := "ok"
	if !r.OK {
		status = "DAMAGED"
		if r.Error != "" {
			status = "UNREADABLE"
		}
	}
	fmt.Fprintf(&b, "  status: %s\n", status)
	_, err := io.WriteString(w, b.String())
	return err
}
