package broker

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"

	"github.com/twmb/franz-go/pkg/kmsg"
	"golang.org/x/sys/unix"

	"github.com/synapsebroker/synapse/log"
	"github.com/synapsebroker/synapse/protocol"
	"github.com/synapsebroker/synapse/tiering"
)

// fetchResponse is a fetch response whose record bytes stay in segment files
// until the connection writes them. It is a kmsg.Response (the embedded
// struct) so errors and tests can treat it as one; conn.writeFetch sends it.
type fetchResponse struct {
	*kmsg.FetchResponse
	reads [][]*log.ReadResult   // [topic][partition], nil where no records
	cold  [][]*tiering.ColdRead // [topic][partition]: batches read from the tiered store
}

func (f *fetchResponse) release() {
	for _, ps := range f.cold {
		for _, r := range ps {
			r.Release()
		}
	}
	f.cold = nil
	for _, ps := range f.reads {
		for _, r := range ps {
			if r != nil {
				r.Release()
			}
		}
	}
	f.reads = nil
}

func (f *fetchResponse) recLen(ti, pi int) int64 {
	if r := f.reads[ti][pi]; r != nil {
		return r.Bytes
	}
	if r := f.cold[ti][pi]; r != nil {
		return r.Len
	}
	return 0 // empty, not null, without data: as Kafka
}

// writeFetch sends a fetch response: header bytes from memory, record bytes
// from the segment files with sendfile(2) at explicit offsets (the shared
// descriptors' positions are never used), corked so header, data and
// trailer leave in full packets.
func (c *conn) writeFetch(corr int32, f *fetchResponse) error {
	defer f.release()
	buf, holes, err := protocol.AppendFetchResponse(c.out[:0], corr, f.FetchResponse, f.recLen)
	if err != nil {
		return err
	}
	c.out = buf
	tc, _ := c.nc.(*net.TCPConn)
	if tc != nil {
		cork(tc, true)
		defer cork(tc, false)
	}
	prev := 0
	for _, h := range holes {
		if _, err := c.nc.Write(buf[prev:h.At]); err != nil {
			return err
		}
		if r := f.reads[h.Topic][h.Part]; r != nil {
			for _, ch := range r.Chunks {
				if err := sendChunk(c.nc, tc, ch, c.scratch()); err != nil {
					return err
				}
			}
		} else if r := f.cold[h.Topic][h.Part]; r != nil {
			if err := writeParts(c.nc, r.Parts); err != nil {
				return err
			}
		}
		prev = h.At
	}
	_, err = c.nc.Write(buf[prev:])
	return err
}

// yieldBytes is how much a large response writes before letting other
// goroutines run: a catch-up reader's socket that never fills would
// otherwise hold a processor for a whole scheduler slice (10 ms), ahead of
// tail consumers' and producers' requests.
const yieldBytes = 1 << 20

// writeParts writes cold-read parts straight from the cached chunks, with
// writev where the connection supports it, about yieldBytes at a time.
func writeParts(w io.Writer, parts [][]byte) error {
	var group net.Buffers
	var n int
	for _, p := range parts {
		for len(p) > 0 {
			take := min(len(p), yieldBytes-n)
			group = append(group, p[:take])
			n += take
			p = p[take:]
			if n < yieldBytes {
				continue
			}
			if _, err := group.WriteTo(w); err != nil { // consumes group
				return err
			}
			group, n = nil, 0
			runtime.Gosched()
		}
	}
	_, err := group.WriteTo(w)
	return err
}

func (c *conn) scratch() []byte {
	if c.copyBuf == nil {
		c.copyBuf = make([]byte, 256<<10)
	}
	return c.copyBuf
}

// sendChunk writes one file range: sendfile for an OS file on a TCP
// connection, a pread/write copy otherwise (in-memory file systems, TLS).
func sendChunk(w io.Writer, tc *net.TCPConn, ch log.Chunk, buf []byte) error {
	if tc != nil {
		if of, ok := ch.File().(log.OSFile); ok {
			return sendfile(tc, of.OSFile(), ch.Pos, ch.Len)
		}
	}
	for off, end := ch.Pos, ch.Pos+ch.Len; off < end; {
		n := min(int64(len(buf)), end-off)
		m, err := ch.File().ReadAt(buf[:n], off)
		if int64(m) < n {
			if err == nil {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return err
		}
		off += n
	}
	return nil
}

var errShortFile = errors.New("segment file shorter than the range to send")

// sendfile copies [off, off+n) of f to the socket in the kernel. The offset
// is passed explicitly, so concurrent sends from one descriptor do not race
// on its file position; EAGAIN parks on the netpoller (with the connection's
// write deadline).
func sendfile(tc *net.TCPConn, f *os.File, off, n int64) error {
	fc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var src int
	if err := fc.Control(func(fd uintptr) { src = int(fd) }); err != nil {
		return err
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	for first := true; n > 0; first = false {
		if !first {
			runtime.Gosched() // as writeParts: other requests first
		}
		var wrote int
		var serr error
		err := rc.Write(func(dst uintptr) bool {
			for {
				wrote, serr = unix.Sendfile(int(dst), src, &off, int(min(n, yieldBytes)))
				// Interrupted before sending anything: again at once, as
				// Go's own sendfile does (waiting for writability could
				// wait for ever: no EAGAIN armed the poller).
				if !errors.Is(serr, unix.EINTR) || wrote > 0 {
					break
				}
			}
			if errors.Is(serr, unix.EAGAIN) {
				serr = nil
				return wrote > 0 // nothing sent yet: wait until writable
			}
			return true
		})
		if err != nil {
			return err
		}
		if serr != nil && !errors.Is(serr, unix.EINTR) {
			return fmt.Errorf("sendfile: %w", serr)
		}
		if wrote == 0 && serr == nil {
			return errShortFile
		}
		n -= int64(wrote)
	}
	return nil
}
