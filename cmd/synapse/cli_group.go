package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
)

// `synapse group list|describe|seek|delete`.

func newGroupCommand() *cobra.Command {
	o := &cliOptions{}
	cmd := groupCommand("group", "List, describe (with lag), seek and delete consumer groups",
		"Manage the consumer groups of a running broker (any Kafka-compatible one).\n\n"+cliExitCodes)
	o.addFlags(cmd.PersistentFlags())
	cmd.AddCommand(newGroupListCommand(o), newGroupDescribeCommand(o), newGroupSeekCommand(o), newGroupDeleteCommand(o))
	return cmd
}

type groupListEntry struct {
	Group        string `json:"group"`
	State        string `json:"state"`
	ProtocolType string `json:"protocol_type"`
	Coordinator  int32  `json:"coordinator"`
}

func newGroupListCommand(o *cliOptions) *cobra.Command {
	return &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List consumer groups",
		Args:    nArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.withAdmin(cmd, func(ctx context.Context, adm *kadm.Client) error {
				gs, err := adm.ListGroups(ctx)
				if err != nil {
					return o.explain(err)
				}
				out := []groupListEntry{}
				for _, g := range gs.Sorted() {
					out = append(out, groupListEntry{g.Group, g.State, g.ProtocolType, g.Coordinator})
				}
				w := cmd.OutOrStdout()
				if o.json() {
					return printJSON(w, out)
				}
				t := newTable(w, "GROUP", "STATE", "PROTOCOL-TYPE", "COORDINATOR")
				for _, g := range out {
					t.row(g.Group, g.State, g.ProtocolType, g.Coordinator)
				}
				return t.flush()
			})
		},
	}
}

type groupMember struct {
	MemberID    string             `json:"member_id"`
	InstanceID  *string            `json:"instance_id"`
	ClientID    string             `json:"client_id"`
	ClientHost  string             `json:"client_host"`
	Assignments map[string][]int32 `json:"assignments"`
}

type groupPartitionLag struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Committed *int64 `json:"committed"` // null: no commit
	LogStart  int64  `json:"log_start_offset"`
	LogEnd    int64  `json:"log_end_offset"`
	Lag       int64  `json:"lag"` // -1: unknown (an error)
	MemberID  string `json:"member_id,omitempty"`
	ClientID  string `json:"client_id,omitempty"`
	Error     string `json:"error,omitempty"`
}

type groupDescription struct {
	Group        string              `json:"group"`
	State        string              `json:"state"`
	ProtocolType string              `json:"protocol_type"`
	Protocol     string              `json:"protocol"`
	Coordinator  int32               `json:"coordinator"`
	Members      []groupMember       `json:"members"`
	Partitions   []groupPartitionLag `json:"partitions"`
	TotalLag     int64               `json:"total_lag"`
}

func describeGroupLag(l kadm.DescribedGroupLag) groupDescription {
	d := groupDescription{Group: l.Group, State: l.State, ProtocolType: l.ProtocolType, Protocol: l.Protocol,
		Coordinator: l.Coordinator.NodeID, Members: []groupMember{}, Partitions: []groupPartitionLag{}}
	for _, m := range l.Members {
		gm := groupMember{MemberID: m.MemberID, InstanceID: m.InstanceID, ClientID: m.ClientID, ClientHost: m.ClientHost,
			Assignments: map[string][]int32{}}
		if a, ok := m.Assigned.AsConsumer(); ok {
			for _, t := range a.Topics {
				ps := slices.Clone(t.Partitions)
				slices.Sort(ps)
				gm.Assignments[t.Topic] = ps
			}
		}
		d.Members = append(d.Members, gm)
	}
	for _, pl := range l.Lag.Sorted() {
		p := groupPartitionLag{Topic: pl.Topic, Partition: pl.Partition, LogStart: pl.Start.Offset, LogEnd: pl.End.Offset,
			Lag: pl.Lag, Error: errString(pl.Err)}
		if pl.Commit.At >= 0 {
			at := pl.Commit.At
			p.Committed = &at
		}
		if pl.Member != nil {
			p.MemberID, p.ClientID = pl.Member.MemberID, pl.Member.ClientID
		}
		if p.Lag > 0 {
			d.TotalLag += p.Lag
		}
		d.Partitions = append(d.Partitions, p)
	}
	return d
}

func newGroupDescribeCommand(o *cliOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "describe GROUP...",
		Short: "Show a group's state, members, assignments, committed offsets and lag per partition",
		Args:  nArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, groups []string) error {
			return o.withAdmin(cmd, func(ctx context.Context, adm *kadm.Client) error {
				lags, err := adm.Lag(ctx, groups...)
				if err != nil {
					return o.explain(err)
				}
				var out []groupDescription
				for _, g := range groups {
					l, ok := lags[g]
					if !ok {
						return fmt.Errorf("group %s: not described", g)
					}
					if err := l.Error(); err != nil {
						return fmt.Errorf("group %s: %w", g, err)
					}
					if l.State == "Dead" && len(l.Lag) == 0 {
						return fmt.Errorf("group %s does not exist: %w", g, kerr.GroupIDNotFound)
					}
					out = append(out, describeGroupLag(l))
				}
				w := cmd.OutOrStdout()
				if o.json() {
					return printJSON(w, out)
				}
				for i, d := range out {
					if i > 0 {
						fmt.Fprintln(w)
					}
					printGroupDescription(w, d)
				}
				return nil
			})
		},
	}
}

func printGroupDescription(w io.Writer, d groupDescription) {
	t := newTable(w)
	t.row("GROUP", d.Group)
	t.row("COORDINATOR", d.Coordinator)
	t.row("STATE", d.State)
	t.row("PROTOCOL", strings.Trim(d.ProtocolType+"/"+d.Protocol, "/"))
	t.row("MEMBERS", len(d.Members))
	t.row("TOTAL-LAG", d.TotalLag)
	t.flush()
	if len(d.Members) > 0 {
		fmt.Fprintln(w)
		t = newTable(w, "MEMBER-ID", "CLIENT-ID", "HOST", "ASSIGNMENTS")
		for _, m := range d.Members {
			var as []string
			for _, topic := range sortedKeys(m.Assignments) {
				as = append(as, topic+int32List(m.Assignments[topic]))
			}
			t.row(m.MemberID, m.ClientID, m.ClientHost, strings.Join(as, " "))
		}
		t.flush()
	}
	fmt.Fprintln(w)
	t = newTable(w, "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-START", "LOG-END", "LAG", "MEMBER-ID", "ERROR")
	for _, p := range d.Partitions {
		cur := "-"
		if p.Committed != nil {
			cur = fmt.Sprint(*p.Committed)
		}
		t.row(p.Topic, p.Partition, cur, p.LogStart, p.LogEnd, p.Lag, p.MemberID, p.Error)
	}
	t.flush()
}

type seekResult struct {
	Topic     string `json:"topic"`
	Partition int32  `json:"partition"`
	Old       *int64 `json:"old"` // null: no commit before
	New       int64  `json:"new"`
	Error     string `json:"error,omitempty"`
}

func newGroupSeekCommand(o *cliOptions) *cobra.Command {
	var (
		to     string
		topics []string
		dryRun bool
	)
	cmd := &cobra.Command{
		Use:   "seek GROUP --to start|end|N|-N|@TS [--topics T,...]",
		Short: "Move the committed offsets of an empty group",
		Long: `Commit new offsets for GROUP: --to start (log start), end, N (offset N,
within the log), -N (N before the end) or @TS (the first record at or after
Unix ms TS), for every partition of --topics (default: the topics the group
has committed offsets for). As in Kafka, only a group without members can be
moved: stop its consumers first.

` + cliExitCodes,
		Example: `  synapse group seek billing --to start
  synapse group seek billing --to @1700000000000 --topics orders --dry-run`,
		Args: nArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			group := args[0]
			if to == "" {
				return usageErrorf("--to is required: start, end, N, -N or @TS")
			}
			spec, err := parseOffsetSpec(to)
			if err != nil {
				return usageErrorf("--to %w", err)
			}
			return o.withAdmin(cmd, func(ctx context.Context, adm *kadm.Client) error {
				dgs, err := adm.DescribeGroups(ctx, group)
				if err != nil {
					return o.explain(err)
				}
				dg := dgs[group]
				if dg.Err != nil {
					return fmt.Errorf("group %s: %w", group, kafkaErr(dg.Err, dg.ErrMessage))
				}
				if len(dg.Members) > 0 || dg.State != "Empty" && dg.State != "Dead" {
					return fmt.Errorf("group %s is %s with %d members: seek moves only the offsets of an empty group (stop its consumers first): %w",
						group, dg.State, len(dg.Members), kerr.NonEmptyGroup)
				}
				old, err := adm.FetchOffsets(ctx, group)
				if err != nil {
					return o.explain(err)
				}
				if err := old.Error(); err != nil {
					return fmt.Errorf("group %s offsets: %w", group, err)
				}
				topics = splitList(strings.Join(topics, ","), ",")
				if len(topics) == 0 {
					topics = sortedKeys(old)
				}
				if len(topics) == 0 {
					return usageErrorf("group %s has no committed offsets: name the topics to seek with --topics", group)
				}
				res, err := newOffsetResolver(ctx, adm, topics)
				if err != nil {
					return o.explain(err)
				}
				offsets := kadm.Offsets{}
				var rs []seekResult
				for _, t := range topics {
					for _, p := range res.partitions(t) {
						at, err := res.resolve(ctx, spec, t, p)
						if err != nil {
							return o.explain(err)
						}
						r := seekResult{Topic: t, Partition: p, New: at}
						if c, ok := old.Lookup(t, p); ok && c.At >= 0 {
							v := c.At
							r.Old = &v
						}
						rs = append(rs, r)
						offsets.Add(kadm.Offset{Topic: t, Partition: p, At: at, LeaderEpoch: -1})
					}
				}
				failed := 0
				if !dryRun {
					resps, err := adm.CommitOffsets(ctx, group, offsets)
					if err != nil {
						return o.explain(err)
					}
					for i, r := range rs {
						c, ok := resps.Lookup(r.Topic, r.Partition)
						switch {
						case !ok:
							rs[i].Error = "no answer for this partition"
						case c.Err != nil:
							rs[i].Error = c.Err.Error()
						}
						if rs[i].Error != "" {
							failed++
						}
					}
				}
				w := cmd.OutOrStdout()
				if o.json() {
					if err := printJSON(w, rs); err != nil {
						return err
					}
				} else {
					t := newTable(w, "TOPIC", "PARTITION", "OLD-OFFSET", "NEW-OFFSET", "ERROR")
					for _, r := range rs {
						oldS := "-"
						if r.Old != nil {
							oldS = fmt.Sprint(*r.Old)
						}
						t.row(r.Topic, r.Partition, oldS, r.New, r.Error)
					}
					if err := t.flush(); err != nil {
						return err
					}
					if dryRun {
						fmt.Fprintln(w, "(dry run: nothing committed)")
					}
				}
				return failures(failed, len(rs), "partitions")
			})
		},
	}
	cmd.Flags().StringVar(&to, "to", "", "new position: start, end, N, -N or @TS (Unix ms)")
	cmd.Flags().StringSliceVar(&topics, "topics", nil, "topics to seek (default: those the group has offsets for)")
	cmd.Flags().BoolVar(&dryRun, "dry-run", false, "show the new offsets without committing them")
	return cmd
}

type groupResult struct {
	Group string `json:"group"`
	Error string `json:"error,omitempty"`
}

func newGroupDeleteCommand(o *cliOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "delete GROUP...",
		Short: "Delete empty consumer groups and their committed offsets",
		Args:  nArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, groups []string) error {
			return o.withAdmin(cmd, func(ctx context.Context, adm *kadm.Client) error {
				resps, err := adm.DeleteGroups(ctx, groups...)
				var se *kadm.ShardErrors
				if err != nil && !errors.As(err, &se) {
					return o.explain(err)
				}
				var rs []groupResult
				failed := 0
				for _, g := range groups {
					r := groupResult{Group: g}
					if d, ok := resps[g]; !ok {
						r.Error = "no answer for this group: " + errString(err)
					} else if d.Err != nil {
						r.Error = kafkaErr(d.Err, d.ErrMessage).Error()
					}
					if r.Error != "" {
						failed++
					}
					rs = append(rs, r)
				}
				w := cmd.OutOrStdout()
				if o.json() {
					if err := printJSON(w, rs); err != nil {
						return err
					}
				} else {
					t := newTable(w, "GROUP", "STATUS")
					for _, r := range rs {
						t.row(r.Group, cmpStr(r.Error, "deleted"))
					}
					if err := t.flush(); err != nil {
						return err
					}
				}
				return failures(failed, len(rs), "groups")
			})
		},
	}
}

func cmpStr(s, or string) string {
	if s != "" {
		return s
	}
	return or
}
