package httpapi

import (
	"context"
	"net"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kversion"
)

// clientIdle is how long a cached client may go unused before it is
// closed (its connections are the broker's to count).
const clientIdle = 5 * time.Minute

// internalSeed is the address Kafka clients of the API bootstrap from:
// their dialer ignores it (every connection is DialInternal's).
const internalSeed = "synapse-internal:9092"

// clientVersions caps the shared clients' requests below the versions
// that name topics by id (Produce v13, Fetch v13): the API's raw requests
// name them.
func clientVersions() *kversion.Versions {
	v := kversion.Stable()
	v.SetMaxKeyVersion(0, 12) // Produce
	v.SetMaxKeyVersion(1, 12) // Fetch
	return v
}

// kafkaOpts are the options every client of the API starts from: its
// connections are internal ones of principal from client.
func kafkaOpts(b Broker, principal, client string) []kgo.Opt {
	return []kgo.Opt{
		kgo.SeedBrokers(internalSeed),
		kgo.Dialer(func(context.Context, string, string) (net.Conn, error) {
			return b.DialInternal(principal, client)
		}),
		kgo.ClientID("synapse-http-api"),
		kgo.RequestRetries(3),
		kgo.RetryTimeout(10 * time.Second),
	}
}

// clientCache holds one shared Kafka client (produce, fetch, metadata,
// admin) per principal and client IP (ACLs may name hosts), at most max;
// the least recently used idle one goes first.
type clientCache struct {
	b   Broker
	max int

	mu     sync.Mutex
	m      map[string]*sharedClient
	closed bool // by closeAll: no more clients
}

type sharedClient struct {
	cl    *kgo.Client
	key   string
	refs  int
	used  time.Time
	stale bool // evicted while in use: closed by the last release
}

func newClientCache(b Broker, max int) *clientCache {
	return &clientCache{b: b, max: max, m: map[string]*sharedClient{}}
}

// get returns the client of principal at client's IP; release it after
// use.
func (c *clientCache) get(principal, client string) (*sharedClient, error) {
	ip, _, err := net.SplitHostPort(client)
	if err != nil {
		ip = client
	}
	key := principal + "\x00" + ip
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, errShuttingDown()
	}
	if sc := c.m[key]; sc != nil {
		sc.refs++
		sc.used = time.Now()
		return sc, nil
	}
	cl, err := kgo.NewClient(append(kafkaOpts(c.b, principal, net.JoinHostPort(ip, "0")), kgo.MaxVersions(clientVersions()))...)
	if err != nil {
		return nil, err
	}
	sc := &sharedClient{cl: cl, key: key, refs: 1, used: time.Now()}
	if len(c.m) >= c.max {
		var oldest *sharedClient
		for _, o := range c.m {
			if oldest == nil || o.used.Before(oldest.used) {
				oldest = o
			}
		}
		c.evictLocked(oldest)
	}
	c.m[key] = sc
	return sc, nil
}

func (c *clientCache) evictLocked(sc *sharedClient) {
	delete(c.m, sc.key)
	if sc.refs == 0 {
		go sc.cl.Close()
	} else {
		sc.stale = true
	}
}

func (c *clientCache) release(sc *sharedClient) {
	c.mu.Lock()
	defer c.mu.Unlock()
	sc.refs--
	sc.used = time.Now()
	if sc.refs == 0 && sc.stale {
		go sc.cl.Close()
	}
}

// expire closes the clients unused since before.
func (c *clientCache) expire(before time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, sc := range c.m {
		if sc.refs == 0 && sc.used.Before(before) {
			c.evictLocked(sc)
		}
	}
}

func (c *clientCache) closeAll() {
	c.mu.Lock()
	all := c.m
	c.m, c.closed = map[string]*sharedClient{}, true
	c.mu.Unlock()
	for _, sc := range all {
		sc.cl.Close()
	}
}

// client returns the caller's shared client; release it after use.
func (a *API) client(q *request) (*sharedClient, error) {
	return a.clients.get(q.principal, q.client)
}
