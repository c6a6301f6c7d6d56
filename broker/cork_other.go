//go:build !linux

package broker

import "net"

// cork is TCP_CORK on Linux; elsewhere responses go out as written (the
// record bytes are still sent with sendfile where the system has it).
func cork(*net.TCPConn, bool) {}
