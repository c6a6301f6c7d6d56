package main

import (
	"fmt"
	"runtime"
	"runtime/debug"

	"github.com/spf13/cobra"
)

// Stamped at build time (see the Makefile's build target):
//
//	go build -ldflags "-X main.version=v0.1.0 -X main.commit=$(git rev-parse HEAD)"
var (
	version = "dev"
	commit  = "unknown"
)

// buildInfo is what `synapse version` reports.
type buildInfo struct {
	Version   string
	Commit    string
	GoVersion string
	Platform  string
}

// currentBuildInfo returns the stamped version and commit, falling back to
// what the go command recorded in the binary (module version, vcs.revision).
func currentBuildInfo() buildInfo {
	bi := buildInfo{
		Version:   version,
		Commit:    commit,
		GoVersion: runtime.Version(),
		Platform:  runtime.GOOS + "/" + runtime.GOARCH,
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return bi
	}
	if bi.Version == "dev" && info.Main.Version != "" && info.Main.Version != "(devel)" {
		bi.Version = info.Main.Version
	}
	if bi.Commit == "unknown" {
		var rev, modified string
		for _, s := range info.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value
			}
		}
		if rev != "" {
			bi.Commit = rev
			if modified == "true" {
				bi.Commit += "-dirty"
			}
		}
	}
	return bi
}

func newVersionCommand() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, commit and Go version",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			bi := currentBuildInfo()
			_, err := fmt.Fprintf(cmd.OutOrStdout(), "version:  %s\ncommit:   %s\ngo:       %s\nplatform: %s\n",
				bi.Version, bi.Commit, bi.GoVersion, bi.Platform)
			return err
		},
	}
}
