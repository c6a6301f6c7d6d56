//go:build !unix

package dirlock

import "os"

// tryLock is a no-op where flock(2) does not exist: the broker is tested on
// Linux only (docs/operations.md).
func tryLock(*os.File) (bool, error) { return false, nil }
