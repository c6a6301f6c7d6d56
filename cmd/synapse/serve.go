package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"

	"github.com/synapsebroker/synapse/log"
)

// serveOptions are the flags of `synapse serve`. Each has a SYNAPSE_*
// environment twin (see bindEnv).
type serveOptions struct {
	dataDir       string
	listen        string
	fsyncInterval time.Duration
	maxOpenFiles  int
}

func (o *serveOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.dataDir, "data-dir", "./data", "directory holding the partition logs (created if missing)")
	fs.StringVar(&o.listen, "listen", "127.0.0.1:9092", "address of the Kafka protocol listener (host:port)")
	fs.DurationVar(&o.fsyncInterval, "fsync-interval", 0,
		"0 = durable: acknowledge only fsync'd data, concurrent appends share fsyncs (group commit); "+
			"> 0 = relaxed: fsync dirty partitions on this interval")
	fs.IntVar(&o.maxOpenFiles, "max-open-files", 1024, "soft bound on open segment files across all partitions")
}

func (o *serveOptions) validate() error {
	var errs []error
	if o.dataDir == "" {
		errs = append(errs, errors.New("--data-dir must not be empty"))
	}
	if _, _, err := net.SplitHostPort(o.listen); err != nil {
		errs = append(errs, fmt.Errorf("--listen %q: %w", o.listen, err))
	}
	if o.fsyncInterval < 0 {
		errs = append(errs, fmt.Errorf("--fsync-interval %s: must not be negative", o.fsyncInterval))
	}
	if o.maxOpenFiles <= 0 {
		errs = append(errs, fmt.Errorf("--max-open-files %d: must be positive", o.maxOpenFiles))
	}
	return errors.Join(errs...)
}

func newServeCommand(root *rootOptions) *cobra.Command {
	o := &serveOptions{}
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the broker",
		Long: `Run the broker on the data directory until SIGINT or SIGTERM.

For now serve opens the partition log store and recovers every partition
under --data-dir; the Kafka protocol listener is not implemented yet.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return serveFunc(cmd, root.logger, o)
		},
	}
	o.AddFlags(cmd.Flags())
	bindEnv(cmd.Flags())
	return cmd
}

func serveFunc(cmd *cobra.Command, logger *zap.Logger, o *serveOptions) error {
	if err := o.validate(); err != nil {
		return err
	}
	// Stop on SIGINT/SIGTERM, or when the command's context is cancelled
	// (tests). After the first signal the default handling is restored, so a
	// second ^C kills a shutdown that hangs.
	ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	dataDir, err := filepath.Abs(o.dataDir)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dataDir, 0o755); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	dirs, err := partitionDirs(dataDir)
	if err != nil {
		return err
	}

	policy := "durable"
	if o.fsyncInterval > 0 {
		policy = "interval " + o.fsyncInterval.String()
	}
	logger.Info("starting",
		zap.String("version", currentBuildInfo().Version),
		zap.String("data_dir", dataDir),
		zap.String("fsync", policy),
		zap.Int("max_open_files", o.maxOpenFiles))

	store := log.OpenStore(log.Options{
		Logger:       logger.Named("log"),
		SyncInterval: o.fsyncInterval,
		MaxOpenFiles: o.maxOpenFiles,
	})
	opened, failed := 0, 0
	for _, dir := range dirs {
		// Until topic configs exist the partition gets default settings with
		// retention off: opening (recovery) must never delete data, and
		// nothing is appended yet, so segment settings do not matter.
		if _, err := store.OpenPartition(dir, log.Config{RetentionMs: -1}); err != nil {
			failed++
			logger.Error("open partition failed, leaving it offline", zap.String("dir", dir), zap.Error(err))
			continue
		}
		opened++
	}
	logger.Info("partitions opened; kafka protocol listener not implemented yet, waiting for a signal",
		zap.Int("partitions", opened),
		zap.Int("failed", failed),
		zap.String("listen", o.listen))

	<-ctx.Done()
	stop()
	logger.Info("shutting down", zap.String("cause", context.Cause(ctx).Error()))
	if err := store.Close(); err != nil {
		logger.Error("close store", zap.Error(err))
		return fmt.Errorf("close store: %w", err)
	}
	logger.Info("stopped")
	return nil
}

// partitionDirs returns the direct subdirectories of dataDir that hold a
// segment (.log) file, sorted by name.
func partitionDirs(dataDir string) ([]string, error) {
	entries, err := os.ReadDir(dataDir)
	if err != nil {
		return nil, err
	}
	var dirs []string
	for _, e := range entries {
		if !e.IsDir() {
			continue
		}
		dir := filepath.Join(dataDir, e.Name())
		files, err := os.ReadDir(dir)
		if err != nil {
			return nil, err
		}
		for _, f := range files {
			if f.Type().IsRegular() && strings.HasSuffix(f.Name(), ".log") {
				dirs = append(dirs, dir)
				break
			}
		}
	}
	return dirs, nil
}
