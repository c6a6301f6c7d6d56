package broker

import (
	"crypto/tls"
	"fmt"
	"net"
	"strings"
)

// Security protocols of a listener, with Kafka's names.
const (
	Plaintext     = "PLAINTEXT"
	SSL           = "SSL"
	SASLPlaintext = "SASL_PLAINTEXT"
	SASLSSL       = "SASL_SSL"
)

// Listener is one Kafka listener: its name, security protocol and the
// address Metadata gives the clients that connect to it.
type Listener struct {
	// Name is the listener's name (Kafka's listener name); it is also its
	// security protocol.
	Name string
	// Protocol is PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL.
	Protocol string
	// Advertised is the host:port clients of this listener are told to
	// connect to (default: the listener's own address).
	Advertised string
	// TLS is the server side of SSL and SASL_SSL listeners.
	TLS *tls.Config
}

// ListenerAddr is a listener as written on the command line:
// PROTOCOL://host:port.
type ListenerAddr struct {
	Name, Protocol, Addr string
}

// ParseListeners parses Kafka's listeners syntax,
// "PLAINTEXT://127.0.0.1:9092,SASL_SSL://0.0.0.0:9093". Each name is a
// security protocol and appears once.
func ParseListeners(s string) ([]ListenerAddr, error) {
	var out []ListenerAddr
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, addr, ok := strings.Cut(item, "://")
		if !ok {
			return nil, fmt.Errorf("listener %q: want NAME://host:port", item)
		}
		name = strings.ToUpper(name)
		switch name {
		case Plaintext, SSL, SASLPlaintext, SASLSSL:
		default:
			return nil, fmt.Errorf("listener %q: the name must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL", item)
		}
		if seen[name] {
			return nil, fmt.Errorf("listener %s given twice", name)
		}
		seen[name] = true
		if _, _, err := net.SplitHostPort(addr); err != nil {
			return nil, fmt.Errorf("listener %q: %w", item, err)
		}
		out = append(out, ListenerAddr{Name: name, Protocol: name, Addr: addr})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no listener in %q", s)
	}
	return out, nil
}

func (l *Listener) usesTLS() bool  { return l.Protocol == SSL || l.Protocol == SASLSSL }
func (l *Listener) usesSASL() bool { return l.Protocol == SASLPlaintext || l.Protocol == SASLSSL }

// listener is a Listener being served, with its advertised endpoint split
// for Metadata.
type listener struct {
	Listener
	host string
	port int32
}

func newListener(l Listener, ln net.Listener) (*listener, error) {
	switch l.Protocol {
	case Plaintext, SSL, SASLPlaintext, SASLSSL:
	case "":
		l.Protocol = Plaintext
	default:
		return nil, fmt.Errorf("broker: listener %s: unknown security protocol %q", l.Name, l.Protocol)
	}
	if l.Name == "" {
		l.Name = l.Protocol
	}
	if l.usesTLS() && l.TLS == nil {
		return nil, fmt.Errorf("broker: listener %s needs a TLS configuration", l.Name)
	}
	addr := l.Advertised
	if addr == "" {
		addr = ln.Addr().String()
	}
	h, p, err := hostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("broker: listener %s: advertised %q: %w", l.Name, addr, err)
	}
	return &listener{Listener: l, host: h, port: p}, nil
}
