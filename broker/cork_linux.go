package broker

import (
	"net"

	"golang.org/x/sys/unix"
)

// cork holds back partial packets (TCP_CORK) while a response is assembled
// from several writes; uncorking flushes.
func cork(tc *net.TCPConn, on bool) {
	rc, err := tc.SyscallConn()
	if err != nil {
		return
	}
	v := 0
	if on {
		v = 1
	}
	rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_CORK, v) })
}
