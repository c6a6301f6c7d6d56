package main

import (
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/synapsebroker/synapse/log/logbench"
)

func newBenchCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure Synapse beside a baseline on this machine and print ratios",
	}
	cmd.AddCommand(newBenchLogCommand())
	cmd.AddCommand(newBenchClientCommands()...)
	return cmd
}

type benchLogOptions struct {
	dir      string
	duration time.Duration
	mib      int64
	openGiB  float64
}

func (o *benchLogOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.dir, "dir", "", "scratch directory on the file system to measure (default: a new temporary directory)")
	fs.DurationVar(&o.duration, "duration", 3*time.Second, "time bound of each append measurement")
	fs.Int64Var(&o.mib, "mib", 512, "size bound of each append measurement, MiB")
	fs.Float64Var(&o.openGiB, "open-gib", 1, "size of the data set for the open-time measurement, GiB")
}

func newBenchLogCommand() *cobra.Command {
	o := &benchLogOptions{}
	cmd := &cobra.Command{
		Use:   "log",
		Short: "Log engine: durable append (1/8/64 appenders) vs a plain write+fdatasync loop, reads, allocations, open time",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			dir := o.dir
			if dir == "" {
				d, err := os.MkdirTemp("", "synapse-bench-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(d)
				dir = d
			}
			return logbench.Run(logbench.Options{Dir: dir, Duration: o.duration, Bytes: o.mib << 20, OpenGiB: o.openGiB, Out: cmd.OutOrStdout()})
		},
	}
	o.AddFlags(cmd.Flags())
	return cmd
}
