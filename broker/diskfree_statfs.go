//go:build linux || darwin || freebsd

package broker

import "golang.org/x/sys/unix"

// diskFree reports the bytes available to unprivileged writers and the
// total bytes of the file system holding dir.
func diskFree(dir string) (free, size int64, ok bool) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, 0, false
	}
	bs := uint64(st.Bsize)
	return int64(uint64(st.Bavail) * bs), int64(uint64(st.Blocks) * bs), true
}
