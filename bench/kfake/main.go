// Command kfake runs franz-go's kfake as a standalone single-broker Kafka,
// the reference broker of `make bench`.
//
//	kfake --listen 127.0.0.1:9092 [--data-dir DIR] [--sync] [--blackhole] [--tls-cert-file F --tls-key-file K]
//
// --data-dir persists through the page cache (kfake syncs on segment roll
// and shutdown, like Kafka's defaults); --sync adds an fsync per batch;
// --blackhole acknowledges produce without storing (calibration);
// --tls-cert-file and --tls-key-file serve TLS (only) on the listener.
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"strconv"
	"syscall"

	"github.com/twmb/franz-go/pkg/kfake"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:9092", "host:port to listen on")
	dataDir := flag.String("data-dir", "", "persist to this directory")
	sync := flag.Bool("sync", false, "fsync every batch")
	blackhole := flag.Bool("blackhole", false, "acknowledge produce without storing")
	certFile := flag.String("tls-cert-file", "", "PEM certificate: serve TLS")
	keyFile := flag.String("tls-key-file", "", "PEM key of --tls-cert-file")
	flag.Parse()
	host, portStr, err := net.SplitHostPort(*listen)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	port, err := strconv.Atoi(portStr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	opts := []kfake.Opt{
		kfake.NumBrokers(1),
		kfake.Ports(port),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			return net.Listen(network, net.JoinHostPort(host, strconv.Itoa(port)))
		}),
		kfake.AllowAutoTopicCreation(),
		kfake.DefaultNumPartitions(1),
	}
	if *dataDir != "" {
		opts = append(opts, kfake.DataDir(*dataDir))
	}
	if *sync {
		opts = append(opts, kfake.SyncWrites())
	}
	if *blackhole {
		opts = append(opts, kfake.BlackholeProduce())
	}
	if *certFile != "" {
		cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		opts = append(opts, kfake.TLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}))
	}
	c, err := kfake.NewCluster(opts...)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Println(c.ListenAddrs()[0])
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, os.Interrupt, syscall.SIGTERM)
	<-sig
	c.Close()
}
