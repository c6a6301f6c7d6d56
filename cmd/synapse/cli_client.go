package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

// The admin CLI (`synapse topic|produce|consume|group|cluster`, issue 18)
// talks to any Kafka-compatible broker with franz-go. Every command takes
// the connection flags below; output is a human table by default and JSON
// with --format json. Exit codes: 0 success, 1 the operation failed (a
// Kafka error, an unreachable broker, a record not produced), 2 a usage
// error (unknown command or flag, wrong arguments, a bad flag value).

const cliExitCodes = `Exit codes: 0 success; 1 the operation failed (a Kafka error, an
unreachable broker, a record not produced); 2 usage error (unknown command
or flag, wrong arguments, bad flag value).`

// usageError is an error in how a command was called: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usageErrorf(format string, a ...any) error {
	return usageError{fmt.Errorf(format, a...)}
}

// exitStatus is the process's exit status after the root command ran c
// (ExecuteC) and it returned err: 0, 1 (the command failed at run time) or
// 2 (usage). Cobra's own errors (unknown command or flag, bad arguments)
// come before the root's PersistentPreRunE, which sets SilenceUsage: a
// command that failed without it set was called wrong.
func exitStatus(c *cobra.Command, err error) int {
	switch {
	case err == nil:
		return 0
	case errors.As(err, new(usageError)):
		return 2
	case c != nil && !c.SilenceUsage:
		return 2
	}
	return 1
}

// cliOptions are the connection and output flags of the admin CLI.
type cliOptions struct {
	brokers       string
	tls           bool
	tlsCA         string
	tlsCert       string
	tlsKey        string
	tlsServerName string
	tlsSkipVerify bool
	saslMechanism string
	saslUser      string
	saslPassword  string
	format        string
	timeout       time.Duration
}

// addFlags registers the flags on fs. The connection flags have SYNAPSE_*
// environment twins (SYNAPSE_BROKERS, SYNAPSE_SASL_PASSWORD, ...).
func (o *cliOptions) addFlags(fs *pflag.FlagSet) {
	conn := pflag.NewFlagSet("connection", pflag.ContinueOnError)
	conn.StringVar(&o.brokers, "brokers", "127.0.0.1:9092", "seed brokers, host:port separated by commas")
	conn.BoolVar(&o.tls, "tls", false, "connect with TLS (implied by the other --tls-* flags)")
	conn.StringVar(&o.tlsCA, "tls-ca", "", "PEM CA file to verify the broker's certificate with (default: the system's roots)")
	conn.StringVar(&o.tlsCert, "tls-cert", "", "PEM client certificate file, for mTLS")
	conn.StringVar(&o.tlsKey, "tls-key", "", "PEM private key file of --tls-cert")
	conn.StringVar(&o.tlsServerName, "tls-server-name", "", "name to verify the broker's certificate for (default: the host dialed)")
	conn.BoolVar(&o.tlsSkipVerify, "tls-insecure-skip-verify", false, "do not verify the broker's certificate (testing only)")
	conn.StringVar(&o.saslMechanism, "sasl-mechanism", "", "SASL mechanism: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512 (empty: no SASL)")
	conn.StringVar(&o.saslUser, "sasl-user", "", "SASL user")
	conn.StringVar(&o.saslPassword, "sasl-password", "", "SASL password (prefer the environment variable)")
	bindEnv(conn)
	fs.AddFlagSet(conn)
	fs.StringVar(&o.format, "format", "table", "output: table (for people) or json (for scripts)")
	fs.DurationVar(&o.timeout, "timeout", 30*time.Second, "how long to wait for the brokers' answers")
}

func (o *cliOptions) validate() error {
	switch o.format {
	case "table", "json":
	default:
		return usageErrorf("--format %q: table or json", o.format)
	}
	if o.timeout <= 0 {
		return usageErrorf("--timeout %s: must be positive", o.timeout)
	}
	if len(o.seeds()) == 0 {
		return usageErrorf("--brokers: no broker address")
	}
	if (o.tlsCert == "") != (o.tlsKey == "") {
		return usageErrorf("--tls-cert and --tls-key go together")
	}
	if o.saslMechanism != "" {
		switch strings.ToUpper(o.saslMechanism) {
		case "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512":
		default:
			return usageErrorf("--sasl-mechanism %q: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512", o.saslMechanism)
		}
		if o.saslUser == "" || o.saslPassword == "" {
			return usageErrorf("--sasl-mechanism needs --sasl-user and --sasl-password (or SYNAPSE_SASL_PASSWORD)")
		}
	}
	return nil
}

func (o *cliOptions) json() bool { return o.format == "json" }

func (o *cliOptions) seeds() []string {
	return splitList(o.brokers, ",")
}

func (o *cliOptions) tlsConfig() (*tls.Config, error) {
	if !o.tls && o.tlsCA == "" && o.tlsCert == "" && !o.tlsSkipVerify && o.tlsServerName == "" {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: o.tlsServerName, InsecureSkipVerify: o.tlsSkipVerify}
	if o.tlsCA != "" {
		pem, err := os.ReadFile(o.tlsCA)
		if err != nil {
			return nil, usageErrorf("--tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, usageErrorf("--tls-ca %s: no PEM certificate", o.tlsCA)
		}
	}
	if o.tlsCert != "" {
		pair, err := tls.LoadX509KeyPair(o.tlsCert, o.tlsKey)
		if err != nil {
			return nil, usageErrorf("--tls-cert/--tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}

// kgoOpts are the options of every client of the CLI: the seeds, TLS and
// SASL as the flags say, then more.
func (o *cliOptions) kgoOpts(more ...kgo.Opt) ([]kgo.Opt, error) {
	if err := o.validate(); err != nil {
		return nil, err
	}
	opts := []kgo.Opt{kgo.SeedBrokers(o.seeds()...), kgo.RetryTimeout(o.timeout), kgo.DialTimeout(min(o.timeout, 10*time.Second))}
	cfg, err := o.tlsConfig()
	if err != nil {
		return nil, err
	}
	if cfg != nil {
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	if o.saslMechanism != "" {
		// The bench clients' mechanisms (franz-go's PLAIN and SCRAM).
		sec := clientSecurity{mechanism: o.saslMechanism, user: o.saslUser, password: o.saslPassword}
		m, err := sec.saslMechanism(false)
		if err != nil {
			return nil, usageError{err}
		}
		opts = append(opts, kgo.SASL(m))
	}
	return append(opts, more...), nil
}

// client is a kgo client with the CLI's options, and a kadm client on it.
func (o *cliOptions) client(more ...kgo.Opt) (*kgo.Client, *kadm.Client, error) {
	opts, err := o.kgoOpts(more...)
	if err != nil {
		return nil, nil, err
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, nil, usageError{err}
	}
	adm := kadm.NewClient(cl)
	adm.SetTimeoutMillis(int32(min(o.timeout, time.Hour).Milliseconds()))
	return cl, adm, nil
}

// withAdmin runs f with an admin client of --brokers and the command's
// context bounded by --timeout, and closes the client after.
func (o *cliOptions) withAdmin(cmd *cobra.Command, f func(ctx context.Context, adm *kadm.Client) error) error {
	cl, adm, err := o.client()
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := o.ctx(cmd)
	defer cancel()
	return f(ctx, adm)
}

// ctx is the command's context bounded by --timeout.
func (o *cliOptions) ctx(cmd *cobra.Command) (context.Context, context.CancelFunc) {
	return context.WithTimeout(cmd.Context(), o.timeout)
}

// explain adds to err what a person needs: which brokers did not answer.
func (o *cliOptions) explain(err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%w: no answer from --brokers %s within --timeout %s", err, o.brokers, o.timeout)
	}
	return err
}

// errString is err's text for tables and JSON; "" for nil.
func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// kafkaErr joins a Kafka error with the broker's message about it.
func kafkaErr(err error, msg string) error {
	if err == nil {
		return nil
	}
	if msg != "" && !strings.Contains(err.Error(), msg) {
		return fmt.Errorf("%w: %s", err, msg)
	}
	return err
}

// failures is the error a command returns when n of its total items
// failed (each already reported in the output).
func failures(n, total int, what string) error {
	if n == 0 {
		return nil
	}
	return fmt.Errorf("%d of %d %s failed", n, total, what)
}

// table writes aligned columns.
type table struct{ tw *tabwriter.Writer }

func newTable(w io.Writer, header ...string) *table {
	t := &table{tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)}
	if len(header) > 0 {
		t.row(toAny(header)...)
	}
	return t
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}

func (t *table) row(cells ...any) {
	for i, c := range cells {
		if i > 0 {
			io.WriteString(t.tw, "\t")
		}
		fmt.Fprint(t.tw, c)
	}
	io.WriteString(t.tw, "\n")
}

func (t *table) flush() error { return t.tw.Flush() }

// printJSON writes v as indented JSON.
func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// parseKVs parses k=v pairs (a flag's values); what names the flag.
func parseKVs(kvs []string, what string) (map[string]string, []string, error) {
	m := make(map[string]string, len(kvs))
	var order []string
	for _, kv := range kvs {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, nil, usageErrorf("%s %q: want key=value", what, kv)
		}
		if _, dup := m[k]; !dup {
			order = append(order, k)
		}
		m[k] = v
	}
	return m, order, nil
}

// sortedKeys are m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// groupCommand is a command of subcommands that refuses unknown ones
// (exit 2) instead of printing help with exit 0.
func groupCommand(use, short, long string) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) > 0 {
				return usageErrorf("unknown command %q for %q", args[0], cmd.CommandPath())
			}
			return cmd.Help()
		},
	}
}

// nArgs is cobra's argument check whose errors are usage errors.
func nArgs(check cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := check(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}
