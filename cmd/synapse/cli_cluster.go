package main

import (
	"context"
	"fmt"

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
	APIKeys int    `json:"api_keys"`
	Error   string `json:"error,omitempty"`
}

type clusterInfo struct {
	ClusterID      string          `json:"cluster_id"`
	Controller     int32           `json:"controller"`
	Brokers        []clusterBroker `json:"brokers"`
	Topics         int             `json:"topics"`
	InternalTopics int             `json:"internal_topics"`
	Partitions     int             `json:"partitions"`
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
				info := clusterInfo{ClusterID: md.Cluster, Controller: md.Controller, Brokers: []clusterBroker{}}
				for _, b := range md.Brokers {
					cb := clusterBroker{NodeID: b.NodeID, Host: b.Host, Port: b.Port, Rack: b.Rack, Controller: b.NodeID == md.Controller}
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
				t.flush()
				fmt.Fprintln(w)
				t = newTable(w, "BROKER", "HOST", "PORT", "RACK", "CONTROLLER", "API-KEYS", "ERROR")
				for _, b := range info.Brokers {
					rack := "-"
					if b.Rack != nil {
						rack = *b.Rack
					}
					t.row(b.NodeID, b.Host, b.Port, rack, b.Controller, b.APIKeys, b.Error)
				}
				return t.flush()
			})
		},
	}
}
