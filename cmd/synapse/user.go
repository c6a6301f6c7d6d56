package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/plain"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

// userOptions are the connection flags of `synapse user`: it manages SCRAM
// users of a running broker through Kafka's own admin APIs
// (DescribeUserScramCredentials / AlterUserScramCredentials), as
// kafka-configs.sh does, so it needs the broker up and an admin login.
type userOptions struct {
	bootstrap     string
	mechanism     string
	adminUser     string
	adminPassFile string
	caFile        string
	certFile      string
	keyFile       string
	timeout       time.Duration
}

func (o *userOptions) AddFlags(fs *pflag.FlagSet) {
	fs.StringVar(&o.bootstrap, "bootstrap-server", "127.0.0.1:9092", "a listener of the broker (host:port)")
	fs.StringVar(&o.mechanism, "sasl-mechanism", "", "SASL mechanism to log in with on a SASL listener: SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN; empty: no SASL")
	fs.StringVar(&o.adminUser, "admin-user", "admin", "user to log in as (a super user, or one with ALTER and DESCRIBE on the cluster)")
	fs.StringVar(&o.adminPassFile, "admin-password-file", "", "file holding that user's password; or set SYNAPSE_ADMIN_PASSWORD")
	fs.StringVar(&o.caFile, "tls-ca-file", "", "PEM CA to verify a TLS listener with (enables TLS)")
	fs.StringVar(&o.certFile, "tls-client-cert-file", "", "PEM client certificate for an mTLS listener")
	fs.StringVar(&o.keyFile, "tls-client-key-file", "", "its private key")
	fs.DurationVar(&o.timeout, "timeout", 15*time.Second, "how long to wait for the broker")
}

func (o *userOptions) admin() (*kadm.Client, func(), error) {
	opts := []kgo.Opt{kgo.SeedBrokers(o.bootstrap), kgo.RequestRetries(2), kgo.RetryTimeout(o.timeout)}
	if o.caFile != "" || o.certFile != "" {
		cfg := &tls.Config{MinVersion: tls.VersionTLS12}
		if o.caFile != "" {
			pem, err := os.ReadFile(o.caFile)
			if err != nil {
				return nil, nil, err
			}
			cfg.RootCAs = x509.NewCertPool()
			if !cfg.RootCAs.AppendCertsFromPEM(pem) {
				return nil, nil, fmt.Errorf("--tls-ca-file %s: no PEM certificate", o.caFile)
			}
		}
		if o.certFile != "" {
			pair, err := tls.LoadX509KeyPair(o.certFile, o.keyFile)
			if err != nil {
				return nil, nil, err
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		opts = append(opts, kgo.DialTLSConfig(cfg))
	}
	if o.mechanism != "" {
		pass := os.Getenv("SYNAPSE_ADMIN_PASSWORD")
		if o.adminPassFile != "" {
			b, err := os.ReadFile(o.adminPassFile)
			if err != nil {
				return nil, nil, err
			}
			pass = strings.TrimRight(string(b), "\r\n")
		}
		if pass == "" {
			return nil, nil, errors.New("--sasl-mechanism needs the admin's password: --admin-password-file or SYNAPSE_ADMIN_PASSWORD")
		}
		switch strings.ToUpper(o.mechanism) {
		case "SCRAM-SHA-256":
			opts = append(opts, kgo.SASL(scram.Auth{User: o.adminUser, Pass: pass}.AsSha256Mechanism()))
		case "SCRAM-SHA-512":
			opts = append(opts, kgo.SASL(scram.Auth{User: o.adminUser, Pass: pass}.AsSha512Mechanism()))
		case "PLAIN":
			opts = append(opts, kgo.SASL(plain.Auth{User: o.adminUser, Pass: pass}.AsMechanism()))
		default:
			return nil, nil, fmt.Errorf("--sasl-mechanism %q: want SCRAM-SHA-256, SCRAM-SHA-512 or PLAIN", o.mechanism)
		}
	}
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return nil, nil, err
	}
	return kadm.NewClient(cl), cl.Close, nil
}

func newUserCommand() *cobra.Command {
	o := &userOptions{}
	cmd := &cobra.Command{
		Use:   "user",
		Short: "Create, delete and list SCRAM users of a running broker",
		Long: `Manage the SCRAM users of a running broker through Kafka's admin APIs
(AlterUserScramCredentials, DescribeUserScramCredentials). PLAIN logins check
the same credentials. Log in as a super user, e.g. the admin that
SYNAPSE_ADMIN_PASSWORD created at the broker's first start:

  SYNAPSE_ADMIN_PASSWORD=... synapse user create alice --bootstrap-server host:9093 \
      --sasl-mechanism SCRAM-SHA-512 --tls-ca-file ca.pem < alice-password.txt`,
	}
	o.AddFlags(cmd.PersistentFlags())
	bindEnv(cmd.PersistentFlags())

	var mechs []string
	var iterations int32
	var passFile string
	create := &cobra.Command{
		Use:   "create NAME",
		Short: "Create a user or change its password (read from --password-file or the first line of stdin)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pass, err := readPassword(cmd.InOrStdin(), passFile)
			if err != nil {
				return err
			}
			var ups []kadm.UpsertSCRAM
			for _, m := range mechs {
				sm, err := scramMechanism(m)
				if err != nil {
					return err
				}
				ups = append(ups, kadm.UpsertSCRAM{User: args[0], Mechanism: sm, Iterations: iterations, Password: pass})
			}
			return o.alter(cmd, nil, ups)
		},
	}
	create.Flags().StringSliceVar(&mechs, "mechanism", []string{"SCRAM-SHA-256", "SCRAM-SHA-512"}, "SCRAM mechanisms to store a credential for")
	create.Flags().Int32Var(&iterations, "iterations", 4096, "PBKDF2 iterations (4096 to 16384; Kafka's tools default to 4096)")
	create.Flags().StringVar(&passFile, "password-file", "", "file holding the new password (default: the first line of stdin)")

	var delMechs []string
	del := &cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a user's credentials",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var dels []kadm.DeleteSCRAM
			for _, m := range delMechs {
				sm, err := scramMechanism(m)
				if err != nil {
					return err
				}
				dels = append(dels, kadm.DeleteSCRAM{User: args[0], Mechanism: sm})
			}
			return o.alter(cmd, dels, nil)
		},
	}
	del.Flags().StringSliceVar(&delMechs, "mechanism", []string{"SCRAM-SHA-256", "SCRAM-SHA-512"}, "SCRAM mechanisms whose credential to delete")

	list := &cobra.Command{
		Use:   "list",
		Short: "List users and their SCRAM mechanisms (never keys)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			adm, closeFn, err := o.admin()
			if err != nil {
				return err
			}
			defer closeFn()
			ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
			defer cancel()
			users, err := adm.DescribeUserSCRAMs(ctx)
			if err != nil {
				return err
			}
			w := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "USER\tMECHANISM\tITERATIONS")
			for _, u := range users.Sorted() {
				if u.Err != nil {
					return fmt.Errorf("user %s: %w", u.User, u.Err)
				}
				for _, ci := range u.CredInfos {
					fmt.Fprintf(w, "%s\t%s\t%d\n", u.User, ci.Mechanism, ci.Iterations)
				}
			}
			return w.Flush()
		},
	}
	for _, c := range []*cobra.Command{create, del, list} {
		bindEnv(c.Flags())
		cmd.AddCommand(c)
	}
	return cmd
}

func (o *userOptions) alter(cmd *cobra.Command, dels []kadm.DeleteSCRAM, ups []kadm.UpsertSCRAM) error {
	adm, closeFn, err := o.admin()
	if err != nil {
		return err
	}
	defer closeFn()
	ctx, cancel := context.WithTimeout(cmd.Context(), o.timeout)
	defer cancel()
	res, err := adm.AlterUserSCRAMs(ctx, dels, ups)
	if err != nil {
		return err
	}
	for _, r := range res.Sorted() {
		if r.Err != nil {
			if r.ErrMessage != "" {
				return fmt.Errorf("user %s: %w: %s", r.User, r.Err, r.ErrMessage)
			}
			return fmt.Errorf("user %s: %w", r.User, r.Err)
		}
		verb := "updated"
		if len(dels) > 0 {
			verb = "deleted"
		}
		fmt.Fprintf(cmd.OutOrStdout(), "user %s %s\n", r.User, verb)
	}
	return nil
}

func scramMechanism(m string) (kadm.ScramMechanism, error) {
	switch strings.ToUpper(m) {
	case "SCRAM-SHA-256":
		return kadm.ScramSha256, nil
	case "SCRAM-SHA-512":
		return kadm.ScramSha512, nil
	}
	return 0, fmt.Errorf("mechanism %q: want SCRAM-SHA-256 or SCRAM-SHA-512", m)
}

func readPassword(stdin io.Reader, file string) (string, error) {
	var pass string
	if file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return "", err
		}
		pass = strings.TrimRight(string(b), "\r\n")
	} else {
		line, err := bufio.NewReader(stdin).ReadString('\n')
		if err != nil && !errors.Is(err, io.EOF) {
			return "", err
		}
		pass = strings.TrimRight(line, "\r\n")
	}
	if pass == "" {
		return "", errors.New("empty password (give --password-file or a line on stdin)")
	}
	return pass, nil
}
