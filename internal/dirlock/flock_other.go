//go:build !unix

package dirlock

import "os"

// tryLock is a no-op where flock(2) does not exist: the broker is tested on
// Linux only (README).
func tryLock(*os.File) (bool, error) { return false, nil }
