package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/twmb/franz-go/pkg/kadm"
)

// `synapse cluster info`.

func newClusterCommand() *cobra.Command {
	o := &cliOptions{}
	cmd := groupCommand("cluster", "Show the cluster: its id, controller, brokers and topics",
		"Describe a running cluster (any Kafka-compatible one).\n\n"+cliExitCodes)
	o.addFlags(cmd.PersistentFlags())
	cmd.AddCommand(newClusterInfoCommand(o))
	return cmd
}

type clusterBroker struct {
	NodeID     int32   `json:"node_id"`
	Host       string  `json:"host"`
	Port       int32   `json:"port"`
	Rack       *string `json:"rack"`
	Controller bool    `json:"controller"`
	// APIKeys is how many APIs the broker serves (ApiVersions). The
	// protocol carries no software name or version of the broker.
	APIKeys int `json:"api_keys"`
	// Leaders and Replicas: partitions it leads, and holds a replica of.
	Leaders  int    `json:"leaders"`
	Replicas int    `json:"replicas"`
	Error    string `json:"error,omitempty"`
}

type clusterInfo struct {
	ClusterID      string          `json:"cluster_id"`
	Controller     int32           `json:"controller"`
	Brokers        []clusterBroker `json:"brokers"`
	Topics         int             `json:"topics"`
	InternalTopics int             `json:"internal_topics"`
	Partitions     int             `json:"partitions"`
	// UnderReplicated: partitions whose ISR is smaller than their replica
	// set; Offline: partitions with no leader.
	UnderReplicated []string `json:"under_replicated"`
	Offline         []string `json:"offline"`
}

func newClusterInfoCommand(o *cliOptions) *cobra.Command {
	return &cobra.Command{
		Use:   "info",
		Short: "Show the cluster id, controller, brokers and topic count",
		Args:  nArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error {
			return o.withAdmin(cmd, func(ctx context.Context, adm *kadm.Client) error {
				md, err := adm.Metadata(ctx)
				if err != nil {
					return o.explain(err)
				}
				vs, err := adm.ApiVersions(ctx)
				if err != nil {
					return o.explain(err)
				}
				info := clusterInfo{ClusterID: md.Cluster, Controller: md.Controller, Brokers: []clusterBroker{},
					UnderReplicated: []string{}, Offline: []string{}}
				leads, holds := map[int32]int{}, map[int32]int{}
				for _, td := range md.Topics.Sorted() {
					for _, pd := range td.Partitions.Sorted() {
						name := fmt.Sprintf("%s/%d", td.Topic, pd.Partition)
						if pd.Leader < 0 {
							info.Offline = append(info.Offline, name)
						} else {
							leads[pd.Leader]++
						}
						for _, r := range pd.Replicas {
							holds[r]++
						}
						if len(pd.ISR) < len(pd.Replicas) {
							info.UnderReplicated = append(info.UnderReplicated, name)
						}
					}
				}
				for _, b := range md.Brokers {
					cb := clusterBroker{NodeID: b.NodeID, Host: b.Host, Port: b.Port, Rack: b.Rack, Controller: b.NodeID == md.Controller,
						Leaders: leads[b.NodeID], Replicas: holds[b.NodeID]}
					if v, ok := vs[b.NodeID]; ok {
						if v.Err != nil {
							cb.Error = v.Err.Error()
						} else {
							v.EachKeySorted(func(int16, int16, int16) { cb.APIKeys++ })
						}
					}
					info.Brokers = append(info.Brokers, cb)
				}
				for _, td := range md.Topics {
					if td.IsInternal {
						info.InternalTopics++
					} else {
						info.Topics++
					}
					info.Partitions += len(td.Partitions)
				}
				w := cmd.OutOrStdout()
				if o.json() {
					return printJSON(w, info)
				}
				t := newTable(w)
				t.row("CLUSTER-ID", info.ClusterID)
				t.row("CONTROLLER", info.Controller)
				t.row("TOPICS", fmt.Sprintf("%d (and %d internal)", info.Topics, info.InternalTopics))
				t.row("PARTITIONS", info.Partitions)
				t.row("UNDER-REPLICATED", listOrNone(info.UnderReplicated))
				t.row("OFFLINE", listOrNone(info.Offline))
				t.flush()
				fmt.Fprintln(w)
				t = newTable(w, "BROKER", "HOST", "PORT", "RACK", "CONTROLLER", "LEADERS", "REPLICAS", "API-KEYS", "ERROR")
				for _, b := range info.Brokers {
					rack := "-"
					if b.Rack != nil {
						rack = *b.Rack
					}
					t.row(b.NodeID, b.Host, b.Port, rack, b.Controller, b.Leaders, b.Replicas, b.APIKeys, b.Error)
				}
				return t.flush()
			})
		},
	}
}

// listOrNone shows a list of partitions, at most 10 of them.
func listOrNone(names []string) string {
	switch {
	case len(names) == 0:
		return "none"
	case len(names) > 10:
		return fmt.Sprintf("%d: %s, …", len(names), strings.Join(names[:10], ", "))
	}
	return fmt.Sprintf("%d: %s", len(names), strings.Join(names, ", "))
}
