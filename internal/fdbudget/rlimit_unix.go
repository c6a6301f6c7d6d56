//go:build unix

package fdbudget

import "syscall"

// RaiseLimit raises RLIMIT_NOFILE's soft limit to the hard one and returns
// both (before and after). On failure it returns the limits unchanged.
func RaiseLimit() (before, after, hard uint64, err error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, 0, 0, err
	}
	before = rl.Cur
	if rl.Cur < rl.Max {
		want := rl
		want.Cur = rl.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &want); err != nil {
			return before, before, rl.Max, err
		}
	}
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return before, before, rl.Max, err
	}
	return before, rl.Cur, rl.Max, nil
}

// CurrentLimit returns RLIMIT_NOFILE's soft limit now (another process may
// have lowered it with prlimit).
func CurrentLimit() (uint64, error) {
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		return 0, err
	}
	return rl.Cur, nil
}
