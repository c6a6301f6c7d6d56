package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// `synapse topic create|list|describe|delete|alter-config|add-partitions`.

func newTopicCommand() *cobra.Command {
	o := &cliOptions{}
	cmd := groupCommand("topic", "Create, list, describe, configure and delete topics",
		"Manage the topics of a running broker (any Kafka-compatible one).\n\n"+cliExitCodes)
	o.addFlags(cmd.PersistentFlags())
	cmd.AddCommand(newTopicCreateCommand(o), newTopicListCommand(o), newTopicDescribeCommand(o),
		newTopicDeleteCommand(o), newTopicAlterConfigCommand(o), newTopicAddPartitionsCommand(o))
	return cmd
}

type topicResult struct {
	Topic      string `json:"topic"`
	Partitions int32  `json:"partitions,omitempty"`
	Error      string `json:"error,omitempty"`
}

// printTopicResults prints one line per topic of a create, delete or
// add-partitions and returns the error of the whole command.
func printTopicResults(w io.Writer, o *cliOptions, rs []topicResult, verb string) error {
	failed := 0
	for _, r := range rs {
		if r.Error != "" {
			failed++
		}
	}
	if o.json() {
		if err := printJSON(w, rs); err != nil {
			return err
		}
	} else {
		t := newTable(w, "TOPIC", "STATUS")
		for _, r := range rs {
			status := verb
			if r.Error != "" {
				status = r.Error
			}
			t.row(r.Topic, status)
		}
		if err := t.flush(); err != nil {
			return err
		}
	}
	return failures(failed, len(rs), "topics")
}

func newTopicCreateCommand(o *cliOptions) *cobra.Command {
	var (
		partitions  int32
		replication int16
		configs     []string
		ifNotExists bool
	)
	cmd := &cobra.Command{
		Use:   "create TOPIC...",
		Short: "Create topics",
		Example: `  synapse topic create orders -p 6 -c retention.ms=86400000 -c cleanup.policy=compact
  synapse topic create orders --if-not-exists --format json`,
		Args: nArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, topics []string) error {
			cfg, _, err := parseKVs(configs, "-c")
			if err != nil {
				return err
			}
			if partitions == 0 || partitions < -1 {
				return usageErrorf("-p %d: a positive count, or -1 for the broker's default", partitions)
			}
			return o.withAdmin(cmd, func(ctx context.Context, adm *kadm.Client) error {
				ptrs := make(map[string]*string, len(cfg))
				for k, v := range cfg {
					ptrs[k] = &v
				}
				resps, err := adm.CreateTopics(ctx, partitions, replication, ptrs, topics...)
				if err != nil {
					return o.explain(err)
				}
				var rs []topicResult
				for _, r := range resps.Sorted() {
					res := topicResult{Topic: r.Topic, Partitions: r.NumPartitions}
					if r.Err != nil && !(ifNotExists && errors.Is(r.Err, kerr.TopicAlreadyExists)) {
						res.Error = kafkaErr(r.Err, r.ErrMessage).Error()
					}
					rs = append(rs, res)
				}
				return printTopicResults(cmd.OutOrStdout(), o, rs, "created")
			})
		},
	}
	fs := cmd.Flags()
	fs.Int32VarP(&partitions, "partitions", "p", -1, "partitions per topic (-1: the broker's default)")
	fs.Int16VarP(&replication, "replication-factor", "r", -1, "replicas per partition (-1: the broker's default; Synapse has one broker: 1)")
	fs.StringArrayVarP(&configs, "config", "c", nil, "topic config key=value (repeatable)")
	fs.BoolVar(&ifNotExists, "if-not-exists", false, "a topic that exists already is no failure")
	return cmd
}

type topicListEntry struct {
	Name              string `json:"name"`
	ID                string `json:"id,omitempty"`
	Partitions        int    `json:"partitions"`
	ReplicationFactor int    `json:"replication_factor"`
	Internal          bool   `json:"internal"`
}

func newTopicListCommand(o *cliOptions) *cobra.Command {
	var internal bool
	cmd := &cobra.Command{
		Use:     "list",
		Aliases: []string{"ls"},
		Short:   "List topics",
		Args:    nArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.withAdmin(cmd, func(ctx context.Context, adm *kadm.Client) error {
				list := adm.ListTopics
				if internal {
					list = adm.ListTopicsWithInternal
				}
				tds, err := list(ctx)
				if err != nil {
					return o.explain(err)
				}
				out := []topicListEntry{}
				for _, td := range tds.Sorted() {
					if td.Err != nil {
						return fmt.Errorf("topic %s: %w", td.Topic, td.Err)
					}
					e := topicListEntry{Name: td.Topic, Partitions: len(td.Partitions), Internal: td.IsInternal}
					if td.ID != (kadm.TopicID{}) {
						e.ID = td.ID.String()
					}
					if len(td.Partitions) > 0 {
						e.ReplicationFactor = len(td.Partitions.Sorted()[0].Replicas)
					}
					out = append(out, e)
				}
				w := cmd.OutOrStdout()
				if o.json() {
					return printJSON(w, out)
				}
				t := newTable(w, "NAME", "PARTITIONS", "REPLICAS", "INTERNAL")
				for _, e := range out {
					t.row(e.Name, e.Partitions, e.ReplicationFactor, e.Internal)
				}
				return t.flush()
			})
		},
	}
	cmd.Flags().BoolVarP(&internal, "internal", "i", false, "list internal topics too (__consumer_offsets, ...)")
	return cmd
}

type partitionInfo struct {
	Partition     int32   `json:"partition"`
	Leader        int32   `json:"leader"`
	LeaderEpoch   int32   `json:"leader_epoch"`
	Replicas      []int32 `json:"replicas"`
	ISR           []int32 `json:"isr"`
	LogStart      int64   `json:"log_start_offset"`
	HighWatermark int64   `json:"high_watermark"`
	Error         string  `json:"error,omitempty"`
}

type configEntry struct {
	Name      string  `json:"name"`
	Value     *string `json:"value"`
	Source    string  `json:"source"`
	Sensitive bool    `json:"sensitive,omitempty"`
}

type topicDescription struct {
	Name       string          `json:"name"`
	ID         string          `json:"id,omitempty"`
	Internal   bool            `json:"internal"`
	Partitions []partitionInfo `json:"partitions"`
	Configs    []configEntry   `json:"configs"`
}

func newTopicDescribeCommand(o *cliOptions) *cobra.Command {
	var allConfigs bool
	cmd := &cobra.Command{
		Use:   "describe TOPIC...",
		Short: "Show topics' partitions (leader, log start, high watermark) and their non-default configs",
		Args:  nArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, topics []string) error {
			return o.withAdmin(cmd, func(ctx context.Context, adm *kadm.Client) error {
				tds, err := adm.ListTopicsWithInternal(ctx, topics...)
				if err != nil {
					return o.explain(err)
				}
				for _, name := range topics {
					td, ok := tds[name]
					if !ok {
						return fmt.Errorf("topic %s: %w", name, kerr.UnknownTopicOrPartition)
					}
					if td.Err != nil {
						return fmt.Errorf("topic %s: %w", name, td.Err)
					}
				}
				starts, err := adm.ListStartOffsets(ctx, topics...)
				if err != nil {
					return o.explain(err)
				}
				ends, err := adm.ListEndOffsets(ctx, topics...)
				if err != nil {
					return o.explain(err)
				}
				rcs, err := adm.DescribeTopicConfigs(ctx, topics...)
				if err != nil {
					return o.explain(err)
				}
				var out []topicDescription
				for _, name := range topics {
					td := tds[name]
					d := topicDescription{Name: name, Internal: td.IsInternal, Partitions: []partitionInfo{}, Configs: []configEntry{}}
					if td.ID != (kadm.TopicID{}) {
						d.ID = td.ID.String()
					}
					for _, p := range td.Partitions.Sorted() {
						pi := partitionInfo{Partition: p.Partition, Leader: p.Leader, LeaderEpoch: p.LeaderEpoch,
							Replicas: p.Replicas, ISR: p.ISR, LogStart: -1, HighWatermark: -1, Error: errString(p.Err)}
						if s, ok := starts.Lookup(name, p.Partition); ok && s.Err == nil {
							pi.LogStart = s.Offset
						}
						if e, ok := ends.Lookup(name, p.Partition); ok && e.Err == nil {
							pi.HighWatermark = e.Offset
						} else if ok && pi.Error == "" {
							pi.Error = errString(e.Err)
						}
						d.Partitions = append(d.Partitions, pi)
					}
					for _, rc := range rcs {
						if rc.Name != name {
							continue
						}
						if rc.Err != nil {
							return fmt.Errorf("topic %s configs: %w", name, kafkaErr(rc.Err, rc.ErrMessage))
						}
						for _, c := range rc.Configs {
							if !allConfigs && c.Source != kmsg.ConfigSourceDynamicTopicConfig {
								continue
							}
							d.Configs = append(d.Configs, configEntry{Name: c.Key, Value: c.Value, Source: configSource(c.Source), Sensitive: c.Sensitive})
						}
					}
					sort.Slice(d.Configs, func(i, j int) bool { return d.Configs[i].Name < d.Configs[j].Name })
					out = append(out, d)
				}
				w := cmd.OutOrStdout()
				if o.json() {
					return printJSON(w, out)
				}
				for i, d := range out {
					if i > 0 {
						fmt.Fprintln(w)
					}
					printTopicDescription(w, d, allConfigs)
				}
				return nil
			})
		},
	}
	cmd.Flags().BoolVarP(&allConfigs, "all-configs", "a", false, "show every config with its source, defaults too")
	return cmd
}

func printTopicDescription(w io.Writer, d topicDescription, all bool) {
	t := newTable(w)
	t.row("NAME", d.Name)
	if d.ID != "" {
		t.row("ID", d.ID)
	}
	t.row("PARTITIONS", len(d.Partitions))
	t.row("INTERNAL", d.Internal)
	t.flush()
	fmt.Fprintln(w)
	t = newTable(w, "PARTITION", "LEADER", "EPOCH", "REPLICAS", "LOG-START", "HIGH-WATERMARK", "ERROR")
	for _, p := range d.Partitions {
		t.row(p.Partition, p.Leader, p.LeaderEpoch, int32List(p.Replicas), p.LogStart, p.HighWatermark, p.Error)
	}
	t.flush()
	fmt.Fprintln(w)
	if len(d.Configs) == 0 {
		fmt.Fprintln(w, "CONFIGS  (all defaults)")
		return
	}
	t = newTable(w, "CONFIG", "VALUE", "SOURCE")
	for _, c := range d.Configs {
		v := "-"
		if c.Value != nil {
			v = *c.Value
		}
		if c.Sensitive {
			v = "(sensitive)"
		}
		t.row(c.Name, v, c.Source)
	}
	t.flush()
}

func int32List(is []int32) string {
	ss := make([]string, len(is))
	for i, v := range is {
		ss[i] = fmt.Sprint(v)
	}
	return "[" + strings.Join(ss, ",") + "]"
}

func configSource(s kmsg.ConfigSource) string {
	switch s {
	case kmsg.ConfigSourceDynamicTopicConfig:
		return "topic"
	case kmsg.ConfigSourceDynamicBrokerConfig:
		return "broker"
	case kmsg.ConfigSourceDynamicDefaultBrokerConfig:
		return "cluster-default"
	case kmsg.ConfigSourceStaticBrokerConfig:
		return "broker-static"
	case kmsg.ConfigSourceDefaultConfig:
		return "default"
	}
	return strings.ToLower(s.String())
}

func newTopicDeleteCommand(o *cliOptions) *cobra.Command {
	var ifExists bool
	cmd := &cobra.Command{
		Use:   "delete TOPIC...",
		Short: "Delete topics and all their records",
		Args:  nArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, topics []string) error {
			return o.withAdmin(cmd, func(ctx context.Context, adm *kadm.Client) error {
				resps, err := adm.DeleteTopics(ctx, topics...)
				if err != nil {
					return o.explain(err)
				}
				var rs []topicResult
				for _, name := range topics {
					r, ok := resps[name]
					res := topicResult{Topic: name}
					switch {
					case !ok || errors.Is(r.Err, kerr.UnknownTopicOrPartition) || errors.Is(r.Err, kerr.UnknownTopicID):
						if !ifExists {
							res.Error = kerr.UnknownTopicOrPartition.Error()
						}
					case r.Err != nil:
						res.Error = kafkaErr(r.Err, r.ErrMessage).Error()
					}
					rs = append(rs, res)
				}
				return printTopicResults(cmd.OutOrStdout(), o, rs, "deleted")
			})
		},
	}
	cmd.Flags().BoolVar(&ifExists, "if-exists", false, "a topic that does not exist is no failure")
	return cmd
}

func newTopicAlterConfigCommand(o *cliOptions) *cobra.Command {
	var sets, deletes []string
	cmd := &cobra.Command{
		Use:     "alter-config TOPIC... --set k=v ... --delete k ...",
		Short:   "Set or delete topic configs (incrementally: others are kept)",
		Example: `  synapse topic alter-config orders --set retention.ms=3600000 --delete cleanup.policy`,
		Args:    nArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, topics []string) error {
			set, order, err := parseKVs(sets, "--set")
			if err != nil {
				return err
			}
			if len(sets)+len(deletes) == 0 {
				return usageErrorf("nothing to do: give --set k=v or --delete k")
			}
			var alters []kadm.AlterConfig
			for _, k := range order {
				v := set[k]
				alters = append(alters, kadm.AlterConfig{Op: kadm.SetConfig, Name: k, Value: &v})
			}
			for _, k := range deletes {
				if _, both := set[k]; both {
					return usageErrorf("--set and --delete both name %s", k)
				}
				alters = append(alters, kadm.AlterConfig{Op: kadm.DeleteConfig, Name: k})
			}
			return o.withAdmin(cmd, func(ctx context.Context, adm *kadm.Client) error {
				resps, err := adm.AlterTopicConfigs(ctx, alters, topics...)
				if err != nil {
					return o.explain(err)
				}
				var rs []topicResult
				for _, name := range topics {
					res := topicResult{Topic: name, Error: kerr.UnknownTopicOrPartition.Error()}
					for _, r := range resps {
						if r.Name == name {
							res.Error = errString(kafkaErr(r.Err, r.ErrMessage))
						}
					}
					rs = append(rs, res)
				}
				return printTopicResults(cmd.OutOrStdout(), o, rs, "altered")
			})
		},
	}
	cmd.Flags().StringArrayVar(&sets, "set", nil, "config to set, key=value (repeatable)")
	cmd.Flags().StringArrayVar(&deletes, "delete", nil, "config to delete, back to its default (repeatable)")
	return cmd
}

func newTopicAddPartitionsCommand(o *cliOptions) *cobra.Command {
	var num, total int
	cmd := &cobra.Command{
		Use:   "add-partitions TOPIC... (--num N | --total N)",
		Short: "Add partitions to topics: --num more (as rpk's -n), or up to --total",
		Long: `Add partitions to topics. --num N adds N partitions to each topic (rpk's
topic add-partitions -n semantics); --total N raises each topic to N
partitions in all (kafka-topics.sh --alter --partitions semantics). Partitions
are never removed.`,
		Example: `  synapse topic add-partitions orders --num 2     # 6 -> 8
  synapse topic add-partitions orders --total 12  # 8 -> 12`,
		Args: nArgs(cobra.MinimumNArgs(1)),
		RunE: func(cmd *cobra.Command, topics []string) error {
			numSet, totalSet := cmd.Flags().Changed("num"), cmd.Flags().Changed("total")
			switch {
			case numSet == totalSet:
				return usageErrorf("give one of --num (partitions to add) or --total (partition count to reach)")
			case numSet && num <= 0:
				return usageErrorf("--num %d: must be positive", num)
			case totalSet && total <= 0:
				return usageErrorf("--total %d: must be positive", total)
			}
			return o.withAdmin(cmd, func(ctx context.Context, adm *kadm.Client) error {
				var resps kadm.CreatePartitionsResponses
				var err error
				if numSet {
					resps, err = adm.CreatePartitions(ctx, num, topics...)
				} else {
					resps, err = adm.UpdatePartitions(ctx, total, topics...)
				}
				if err != nil {
					return o.explain(err)
				}
				tds, err := adm.ListTopics(ctx, topics...)
				if err != nil {
					return o.explain(err)
				}
				var rs []topicResult
				for _, name := range topics {
					res := topicResult{Topic: name, Partitions: int32(len(tds[name].Partitions))}
					if r, ok := resps[name]; !ok {
						res.Error = kerr.UnknownTopicOrPartition.Error()
					} else if r.Err != nil {
						res.Error = kafkaErr(r.Err, r.ErrMessage).Error()
					}
					rs = append(rs, res)
				}
				if o.json() {
					return printTopicResults(cmd.OutOrStdout(), o, rs, "")
				}
				t := newTable(cmd.OutOrStdout(), "TOPIC", "PARTITIONS", "STATUS")
				failed := 0
				for _, r := range rs {
					status := "ok"
					if r.Error != "" {
						status = r.Error
						failed++
					}
					t.row(r.Topic, r.Partitions, status)
				}
				if err := t.flush(); err != nil {
					return err
				}
				return failures(failed, len(rs), "topics")
			})
		},
	}
	cmd.Flags().IntVarP(&num, "num", "n", 0, "partitions to add to each topic")
	cmd.Flags().IntVar(&total, "total", 0, "partition count each topic is raised to")
	return cmd
}
