package log

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

// Sync uses fdatasync(2): it flushes the data and the metadata needed to read
// it back (the size of an appended file), skipping timestamps, which saves a
// journal write per group commit.
func (f osFile) Sync() error {
	rc, err := f.File.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := rc.Control(func(fd uintptr) {
		for {
			serr = unix.Fdatasync(int(fd))
			if !errors.Is(serr, unix.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	if serr != nil {
		return &os.PathError{Op: "fdatasync", Path: f.Name(), Err: serr}
	}
	return nil
}

// syncfsReports is whether this kernel's syncfs(2) reports every failure:
// writeback errors since Linux 5.8, the file system's own sync (a journal
// commit) since 5.17. Before, syncfs cannot stand in for fdatasync.
var syncfsReports = sync.OnceValue(func() bool {
	var u unix.Utsname
	if unix.Uname(&u) != nil {
		return false
	}
	rel := unix.ByteSliceToString(u.Release[:])
	parts := strings.SplitN(rel, ".", 3)
	if len(parts) < 2 {
		return false
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(strings.TrimLeftFunc(parts[1], func(r rune) bool { return r < '0' || r > '9' }))
	if err1 != nil || err2 != nil {
		return false
	}
	return major > 5 || (major == 5 && minor >= 17)
})

func (osFS) Device(dir string) (uint64, bool) {
	if !syncfsReports() {
		return 0, false
	}
	var st unix.Stat_t
	if err := unix.Stat(dir, &st); err != nil {
		return 0, false
	}
	return uint64(st.Dev), true
}

func (osFS) OpenSyncFS(dir string) (SyncFSHandle, error) {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	return &syncfsHandle{fd: fd, dir: dir}, nil
}

// syncfsHandle is a directory descriptor held for syncfs(2): the kernel
// samples the file system's writeback-error counter when it is opened, so
// each later failure is reported to it once, whatever other callers of
// syncfs saw.
type syncfsHandle struct {
	mu  sync.Mutex
	fd  int
	dir string
}

func (h *syncfsHandle) SyncFS() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	var err error
	for {
		err = unix.Syncfs(h.fd)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return &os.PathError{Op: "syncfs", Path: h.dir, Err: err}
	}
	return nil
}

func (h *syncfsHandle) Close() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fd < 0 {
		return nil
	}
	err := unix.Close(h.fd)
	h.fd = -1
	return err
}
