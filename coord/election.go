package coord

import (
	"context"
	"fmt"
	"strconv"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
	"go.uber.org/zap"
)

// Leadership is a won controller election. It lasts until Resign, or until
// the session is lost (Client.Done); every controller write must carry
// Fence so that it fails once the leadership is gone, even if the
// controller has not noticed yet.
type Leadership struct {
	c   *Client
	e   *concurrency.Election
	key string
	rev int64
}

// Campaign blocks until this client is the controller, ctx ends, or the
// session is lost. The candidate value is id in decimal, which Views report
// as Controller. Only one campaign per Client may be active at a time: the
// election key is derived from the session lease.
func (c *Client) Campaign(ctx context.Context, id int32) (*Leadership, error) {
	op := fmt.Sprintf("campaign as %d", id)
	if id < 0 {
		return nil, fmt.Errorf("coord: %s: negative id", op)
	}
	// NewElection appends the "/", giving keys controller/<lease hex>.
	e := concurrency.NewElection(c.sess, c.prefix+"controller")

	// Campaign only watches for its predecessors' deletion; if our own lease
	// dies meanwhile it would still "win". Tie the campaign to the session.
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stop := context.AfterFunc(c.sess.Ctx(), cancel)
	defer stop()

	if err := e.Campaign(cctx, strconv.FormatInt(int64(id), 10)); err != nil {
		if ctx.Err() == nil && c.sess.Ctx().Err() != nil {
			return nil, fmt.Errorf("coord: %s: %w", op, ErrSessionLost)
		}
		return nil, c.wrapErr(op, err)
	}

	// Campaign can return nil after the session expired (its waits ended
	// because the keys vanished, ours included): confirm our key survives.
	resp, err := c.cli.Get(ctx, e.Key())
	if err != nil {
		c.resign(e)
		return nil, c.wrapErr(op+": confirm leadership", err)
	}
	if len(resp.Kvs) == 0 || resp.Kvs[0].CreateRevision != e.Rev() {
		return nil, fmt.Errorf("coord: %s: election key gone: %w", op, ErrSessionLost)
	}
	c.log.Info("won controller election", zap.Int32("id", id), zap.String("key", e.Key()), zap.Int64("rev", e.Rev()))
	return &Leadership{c: c, e: e, key: e.Key(), rev: e.Rev()}, nil
}

// resign best-effort withdraws a candidacy we are abandoning, so it does not
// block other candidates until the session ends.
func (c *Client) resign(e *concurrency.Election) {
	ctx, cancel := context.WithTimeout(c.cli.Ctx(), defaultDialTimeout)
	defer cancel()
	if err := e.Resign(ctx); err != nil {
		c.log.Warn("resign after failed campaign", zap.Error(err))
	}
}

// Fence is the compare to put on every controller write: it holds only while
// our election key is the one created when we won.
func (l *Leadership) Fence() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(l.key), "=", l.rev)
}

// Rev is the election key's CreateRevision; it increases with every new
// leadership and can serve as a controller epoch.
func (l *Leadership) Rev() int64 { return l.rev }

// Resign gives up the leadership so another candidate can win at once.
func (l *Leadership) Resign(ctx context.Context) error {
	if err := l.e.Resign(ctx); err != nil {
		return l.c.wrapErr("resign controller", err)
	}
	l.c.log.Info("resigned controller leadership", zap.String("key", l.key))
	return nil
}
