package main

import (
	"time"

	"github.com/spf13/cobra"
)

// newInspectCommand groups the read-only tools for data on disk (bbolt's
// check, Kafka's kafka-dump-log). They never modify what they read, so they
// are safe on the data directory of a running broker.
func newInspectCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "inspect",
		Short: "Read-only tools for segment files and partition directories",
	}
	cmd.AddCommand(newInspectDumpCommand(), newInspectVerifyCommand())
	return cmd
}

// formatMillis renders a Kafka timestamp (ms since the epoch) as RFC 3339 in
// UTC with milliseconds; negative means "no timestamp" and gives "".
func formatMillis(ms int64) string {
	if ms < 0 {
		return ""
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}
