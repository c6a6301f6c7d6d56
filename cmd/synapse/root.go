package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// rootOptions are the persistent flags every subcommand inherits, and the
// logger built from them before any subcommand runs.
type rootOptions struct {
	logLevel  string
	logFormat string

	// logger is built in PersistentPreRunE; subcommands read it at run time.
	logger *zap.Logger
}

func (o *rootOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.logLevel, "log-level", "info", "log level: debug, info, warn or error")
	fs.StringVar(&o.logFormat, "log-format", "console", "log format: console or json")
}

func newRootCommand() *cobra.Command {
	o := &rootOptions{}
	cmd := &cobra.Command{
		Use:   "synapse",
		Short: "Synapse is a Kafka-wire-compatible broker with a two-tier log",
		// Flags and arguments are checked before PersistentPreRunE, so usage
		// is still printed for those mistakes but not for run-time failures.
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			cmd.SilenceUsage = true
			// A bad SYNAPSE_* value or log flag is a usage error (exit 2).
			if err := applyEnv(cmd.Flags()); err != nil {
				return usageError{err}
			}
			logger, err := newLogger(cmd.ErrOrStderr(), o.logLevel, o.logFormat)
			if err != nil {
				return usageError{err}
			}
			o.logger = logger
			return nil
		},
	}
	o.AddFlags(cmd.PersistentFlags())
	bindEnv(cmd.PersistentFlags())
	cmd.AddCommand(
		newServeCommand(o),
		newInspectCommand(),
		newVersionCommand(),
		newBenchCommand(),
		newUserCommand(),
		newTopicCommand(), newProduceCommand(), newConsumeCommand(), newGroupCommand(), newClusterCommand(),
		newDemoCommand(o),
	)
	return cmd
}

// newLogger builds the process's one logger. It writes to w (stderr), never
// to stdout, which belongs to command output.
func newLogger(w io.Writer, level, format string) (*zap.Logger, error) {
	var lvl zapcore.Level
	switch level {
	case "debug", "info", "warn", "error":
		if err := lvl.UnmarshalText([]byte(level)); err != nil {
			return nil, err
		}
	default:
		return nil, fmt.Errorf("invalid --log-level %q: want debug, info, warn or error", level)
	}
	ec := zap.NewProductionEncoderConfig()
	ec.EncodeTime = zapcore.ISO8601TimeEncoder
	ec.EncodeDuration = zapcore.StringDurationEncoder
	var enc zapcore.Encoder
	switch format {
	case "console":
		ec.EncodeLevel = zapcore.CapitalLevelEncoder
		enc = zapcore.NewConsoleEncoder(ec)
	case "json":
		enc = zapcore.NewJSONEncoder(ec)
	default:
		return nil, fmt.Errorf("invalid --log-format %q: want console or json", format)
	}
	ws := zapcore.Lock(zapcore.AddSync(w))
	return zap.New(zapcore.NewCore(enc, ws, lvl), zap.ErrorOutput(ws)), nil
}
