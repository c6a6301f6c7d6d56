package broker

import (
	"errors"
	"net"
	"time"

	"go.uber.org/zap"
)

// Internal connections: the HTTP API (package httpapi) talks to the broker
// as a Kafka client does, over connections that never leave the process.
// Each is one end of an in-memory pipe (net.Pipe: no file descriptor),
// served like an accepted connection that already authenticated as a
// principal, so every request goes through the same handlers, limits and
// ACLs as a Kafka client's. They count against MaxConnections and Shutdown
// closes them like the others.

// ErrConnectionLimit is returned by DialInternal when the broker already
// serves MaxConnections connections.
var ErrConnectionLimit = errors.New("broker: connection limit reached")

// internalListener is the listener internal connections are served on:
// plaintext (no TLS, no SASL: the principal is given), advertising
// Config.AdvertisedAddr so Metadata looks as it does to Kafka clients.
func (s *Server) internalListener() *listener {
	l := &listener{Listener: Listener{Name: "INTERNAL", Protocol: Plaintext}, host: "localhost", port: 9092}
	if h, p, err := hostPort(s.cfg.AdvertisedAddr); err == nil {
		l.host, l.port = h, p
	}
	return l
}

// internalConn is the broker's end of an internal connection: its remote
// address is the HTTP client's, which ACLs with a host and DescribeGroups
// see.
type internalConn struct {
	net.Conn
	remote net.Addr
}

func (c internalConn) RemoteAddr() net.Addr { return c.remote }

// DialInternal returns a connection to the broker served as an
// authenticated connection of principal ("User:alice"; auth.Anonymous
// when no one logs in) from client, the address ("ip:port") the request
// came from. Requests on it are authorized as principal's from client's
// IP. It fails once the broker is shutting down or at MaxConnections.
func (s *Server) DialInternal(principal, client string) (net.Conn, error) {
	if s.shutting.Load() {
		return nil, ErrServerClosed
	}
	// An in-memory pipe, not a socket pair: it holds no descriptor, so
	// however many internal connections the HTTP API opens, the
	// descriptors stay the log segments' and Kafka clients'. It supports
	// deadlines; the fetch path writes it with its copy fallback (sendfile
	// is for *net.TCPConn only).
	ours, theirs := net.Pipe()
	remote := net.Addr(&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if ap, err := net.ResolveTCPAddr("tcp", client); err == nil && ap.IP != nil {
		remote = ap
	}
	s.mu.Lock()
	if s.shutting.Load() || len(s.conns) >= s.cfg.MaxConnections {
		s.mu.Unlock()
		ours.Close()
		theirs.Close()
		if s.shutting.Load() {
			return nil, ErrServerClosed
		}
		s.repeat.Warn("connection limit reached; refusing an internal connection (HTTP API)", zap.Int("max_connections", s.cfg.MaxConnections))
		return nil, ErrConnectionLimit
	}
	c := newConn(s, internalConn{Conn: ours, remote: remote}, s.internalListener())
	c.principal, c.authed = principal, true
	s.conns[c] = struct{}{}
	s.connWG.Add(1)
	s.mu.Unlock()
	go c.serve()
	return theirs, nil
}

// Login checks user and password as PLAIN does (against the SCRAM
// credentials) and returns the principal ("User:<user>"). Unlike
// CheckLogin it asks for no ACL: what the principal may do is decided
// request by request. Failures are audited and answered after
// FailedAuthDelay, as a failed SASL exchange is (a password guesser gets
// few tries a second per connection).
func (s *Server) Login(user, password, client string) (string, bool) {
	if !s.sec.users.CheckPlain(user, password) {
		s.sec.audit.Warn("authentication failed", zap.String("event", "authentication_failed"), zap.String("mechanism", "HTTP Basic"),
			zap.String("client", client))
		if d := s.cfg.FailedAuthDelay; d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-s.ctx.Done():
				t.Stop()
			}
		}
		return "", false
	}
	return "User:" + user, true
}
