//go:build !unix

package fdbudget

import "errors"

var errNoRlimit = errors.New("fdbudget: no RLIMIT_NOFILE on this system")

// RaiseLimit is unsupported here.
func RaiseLimit() (before, after, hard uint64, err error) { return 0, 0, 0, errNoRlimit }

// CurrentLimit is unsupported here.
func CurrentLimit() (uint64, error) { return 0, errNoRlimit }
