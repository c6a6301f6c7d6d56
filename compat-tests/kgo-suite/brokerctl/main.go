// Command brokerctl is what kgo-suite.sh needs done in Go:
//
//	brokerctl free-ports N
//	    prints N distinct free TCP ports of 127.0.0.1, separated by spaces
//	    (each bound to port 0 and closed: free when printed).
//	brokerctl ping ADDR
//	    exit 0 once the PLAINTEXT listener at ADDR answers ApiVersions and
//	    Metadata (kgo's Ping), 1 if it does not within 2 s.
//	brokerctl scram-user SASL_ADDR ADMIN_PASSWORD USER PASSWORD
//	    as the super user admin (SCRAM-SHA-512 over the SASL_PLAINTEXT
//	    listener SASL_ADDR) gives USER SCRAM-SHA-256 and SCRAM-SHA-512
//	    credentials (4096 iterations) with AlterUserScramCredentials, as
//	    kafka-configs.sh --alter --add-config 'SCRAM-SHA-256=[...]' does.
package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sasl/scram"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	var err error
	switch args := os.Args[2:]; os.Args[1] {
	case "free-ports":
		if len(args) != 1 {
			usage()
		}
		err = freePorts(args[0])
	case "ping":
		if len(args) != 1 {
			usage()
		}
		err = ping(args[0])
	case "scram-user":
		if len(args) != 4 {
			usage()
		}
		err = scramUser(args[0], args[1], args[2], args[3])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "brokerctl %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: brokerctl free-ports N | ping ADDR | scram-user SASL_ADDR ADMIN_PASSWORD USER PASSWORD")
	os.Exit(2)
}

func freePorts(count string) error {
	n, err := strconv.Atoi(count)
	if err != nil || n < 1 || n > 64 {
		return fmt.Errorf("bad count %q", count)
	}
	// All held open until all are chosen, so none repeats.
	var ports []string
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return err
		}
		defer l.Close()
		ports = append(ports, strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	}
	fmt.Println(strings.Join(ports, " "))
	return nil
}

func ping(addr string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.RetryTimeout(time.Second))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return cl.Ping(ctx)
}

func scramUser(addr, adminPassword, user, password string) error {
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr),
		kgo.SASL(scram.Auth{User: "admin", Pass: adminPassword}.AsSha512Mechanism()))
	if err != nil {
		return err
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	res, err := kadm.NewClient(cl).AlterUserSCRAMs(ctx, nil, []kadm.UpsertSCRAM{
		{User: user, Mechanism: kadm.ScramSha256, Iterations: 4096, Password: password},
		{User: user, Mechanism: kadm.ScramSha512, Iterations: 4096, Password: password},
	})
	if err == nil {
		err = res.Error()
	}
	if err != nil {
		return fmt.Errorf("AlterUserScramCredentials %s: %w", user, err)
	}
	return nil
}
