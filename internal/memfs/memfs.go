// Package memfs is an in-memory file system that models what survives a
// power loss, for crash-testing the log engine. It is modelled after
// pebble's vfs.NewCrashableMem: every file keeps its current contents and the
// contents as of its last Sync, every directory keeps its current entries and
// the entries as of its last SyncDir, and CrashClone builds the file system a
// machine would find after losing power.
//
// *FS has the same method set as log.FS except that OpenFile returns the
// local File interface (declared identically to log.File); package log
// adapts it in its tests, because memfs must not import log.
//
// Paths are cleaned with path/filepath and resolved from the root "/";
// relative paths are treated as relative to the root.
package memfs

import (
	"bytes"
	"errors"
	"io"
	"maps"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
)

// File is an open file. It has the same method set as log.File.
type File interface {
	io.ReaderAt
	io.WriterAt
	// Sync makes the file's current contents durable (for every handle of
	// the file), but not its directory entry: see FS.SyncDir.
	Sync() error
	Truncate(size int64) error
	Size() (int64, error)
	Close() error
}

// FS is an in-memory, crashable file system. The zero value is not usable;
// call New. All methods are safe for concurrent use.
type FS struct {
	mu     sync.Mutex
	root   *dir
	inject Injector
}

// inode is a file's contents. synced is always a private copy, never aliased
// with data.
type inode struct {
	data   []byte
	synced []byte
}

// dir is a directory: current entries and the entries as of the last SyncDir.
type dir struct {
	entries map[string]entry
	synced  map[string]entry
}

// entry is a directory entry: exactly one of file and dir is set.
type entry struct {
	file *inode
	dir  *dir
}

func newDir() *dir {
	return &dir{entries: map[string]entry{}, synced: map[string]entry{}}
}

// New returns an empty file system holding only the root directory "/",
// which always survives a crash.
func New() *FS { return &FS{root: newDir()} }

// clean returns the cleaned absolute form of name.
func clean(name string) string {
	return filepath.ToSlash(filepath.Join("/", name))
}

func split(p string) []string {
	if p == "/" {
		return nil
	}
	return strings.Split(p[1:], "/")
}

// walk returns the directory at the cleaned path p.
func (fs *FS) walk(p string) (*dir, error) {
	d := fs.root
	for _, part := range split(p) {
		e, ok := d.entries[part]
		switch {
		case !ok:
			return nil, os.ErrNotExist
		case e.dir == nil:
			return nil, syscall.ENOTDIR
		}
		d = e.dir
	}
	return d, nil
}

// parent returns the directory holding the cleaned path p and p's base name.
func (fs *FS) parent(p string) (*dir, string, error) {
	if p == "/" {
		return nil, "", syscall.EINVAL
	}
	i := strings.LastIndexByte(p, '/')
	d, err := fs.walk(p[:max(i, 1)])
	return d, p[i+1:], err
}

func pathErr(op, name string, err error) error {
	return &os.PathError{Op: op, Path: name, Err: err}
}

// injectLocked calls the injector, if any, for a mutating operation.
func (fs *FS) injectLocked(op Op, path string) error {
	if fs.inject == nil {
		return nil
	}
	return fs.inject(op, path)
}

// OpenFile opens name like os.OpenFile. Supported flags are the access modes
// O_RDONLY, O_WRONLY and O_RDWR combined with O_CREATE, O_EXCL and O_TRUNC;
// O_APPEND is rejected and other flags are ignored, as is perm. The parent
// directory must exist. Errors are *os.PathError wrapping os.ErrNotExist
// (missing file without O_CREATE, or missing parent) or os.ErrExist
// (O_CREATE|O_EXCL on an existing file). Creating a file is injected as
// OpCreate; O_TRUNC on an existing file opened for writing as OpTruncate.
func (fs *FS) OpenFile(name string, flag int, perm os.FileMode) (File, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	if flag&os.O_APPEND != 0 {
		return nil, pathErr("open", name, syscall.EINVAL)
	}
	acc := flag & (os.O_WRONLY | os.O_RDWR)
	f := &file{fs: fs, name: name, read: acc != os.O_WRONLY, write: acc != os.O_RDONLY}
	p := clean(name)
	d, base, err := fs.parent(p)
	if err != nil {
		return nil, pathErr("open", name, err)
	}
	e, ok := d.entries[base]
	switch {
	case ok && e.dir != nil:
		return nil, pathErr("open", name, syscall.EISDIR)
	case ok && flag&(os.O_CREATE|os.O_EXCL) == os.O_CREATE|os.O_EXCL:
		return nil, pathErr("open", name, os.ErrExist)
	case !ok && flag&os.O_CREATE == 0:
		return nil, pathErr("open", name, os.ErrNotExist)
	case !ok:
		if err := fs.injectLocked(OpCreate, p); err != nil {
			return nil, err
		}
		e = entry{file: &inode{}}
		d.entries[base] = e
	case flag&os.O_TRUNC != 0 && f.write && len(e.file.data) > 0:
		if err := fs.injectLocked(OpTruncate, p); err != nil {
			return nil, err
		}
		e.file.data = nil
	}
	f.ino = e.file
	return f, nil
}

// Remove removes a file or an empty directory. The removal is durable only
// after SyncDir of the parent; until then a crash brings the entry back.
// Open handles of a removed file keep working. Injected as OpRemove.
func (fs *FS) Remove(name string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	p := clean(name)
	d, base, err := fs.parent(p)
	if err != nil {
		return pathErr("remove", name, err)
	}
	e, ok := d.entries[base]
	switch {
	case !ok:
		return pathErr("remove", name, os.ErrNotExist)
	case e.dir != nil && len(e.dir.entries) > 0:
		return pathErr("remove", name, syscall.ENOTEMPTY)
	}
	if err := fs.injectLocked(OpRemove, p); err != nil {
		return err
	}
	delete(d.entries, base)
	return nil
}

// Rename atomically moves oldname to newname. A file replaces an existing
// file newname; a directory may be renamed but replaces nothing, and nothing
// replaces a directory (os.ErrExist). The
// rename is durable only after SyncDir of both parents (after SyncDir of only
// the new parent, a crash may leave the file under both names). Errors are
// *os.LinkError. Injected as OpRename.
func (fs *FS) Rename(oldname, newname string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	lerr := func(err error) error {
		return &os.LinkError{Op: "rename", Old: oldname, New: newname, Err: err}
	}
	op, np := clean(oldname), clean(newname)
	od, ob, err := fs.parent(op)
	if err != nil {
		return lerr(err)
	}
	src, ok := od.entries[ob]
	if !ok {
		return lerr(os.ErrNotExist)
	}
	nd, nb, err := fs.parent(np)
	if err != nil {
		return lerr(err)
	}
	if op == np {
		return nil
	}
	if dst, ok := nd.entries[nb]; ok && (dst.dir != nil || src.dir != nil) {
		return lerr(os.ErrExist)
	}
	if src.dir != nil && strings.HasPrefix(np, op+"/") {
		return lerr(syscall.EINVAL)
	}
	if err := fs.injectLocked(OpRename, op); err != nil {
		return err
	}
	delete(od.entries, ob)
	nd.entries[nb] = src
	return nil
}

// MkdirAll creates dir and any missing parents; perm is ignored. A new
// directory survives a crash only if its parent is SyncDir'd afterwards (or
// MarkAllSynced is called). Injected once per call, as OpMkdir, when
// something is created.
func (fs *FS) MkdirAll(dir string, perm os.FileMode) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	p := clean(dir)
	parts := split(p)
	d, i := fs.root, 0
	for ; i < len(parts); i++ {
		e, ok := d.entries[parts[i]]
		if !ok {
			break
		}
		if e.dir == nil {
			return pathErr("mkdir", dir, syscall.ENOTDIR)
		}
		d = e.dir
	}
	if i == len(parts) {
		return nil
	}
	if err := fs.injectLocked(OpMkdir, p); err != nil {
		return err
	}
	for ; i < len(parts); i++ {
		nd := newDir()
		d.entries[parts[i]] = entry{dir: nd}
		d = nd
	}
	return nil
}

// ReadDir returns the sorted names of the files and subdirectories of dir.
func (fs *FS) ReadDir(dir string) ([]string, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	d, err := fs.walk(clean(dir))
	if err != nil {
		return nil, pathErr("readdir", dir, err)
	}
	return slices.Sorted(maps.Keys(d.entries)), nil
}

// SyncDir makes the current entries of dir durable: creations, renames and
// removals in dir survive a crash from now on. It does not sync file data.
// Injected as OpSyncDir.
func (fs *FS) SyncDir(dir string) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	p := clean(dir)
	d, err := fs.walk(p)
	if err != nil {
		return pathErr("syncdir", dir, err)
	}
	if err := fs.injectLocked(OpSyncDir, p); err != nil {
		return err
	}
	d.synced = maps.Clone(d.entries)
	return nil
}

// MarkAllSynced makes everything currently reachable durable, as if every
// file and directory had been synced. Useful to set up a test's initial state.
func (fs *FS) MarkAllSynced() {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	seen := map[*dir]bool{}
	var mark func(d *dir)
	mark = func(d *dir) {
		if seen[d] {
			return
		}
		seen[d] = true
		d.synced = maps.Clone(d.entries)
		for _, e := range d.entries {
			if e.file != nil {
				e.file.synced = bytes.Clone(e.file.data)
			} else {
				mark(e.dir)
			}
		}
	}
	mark(fs.root)
}

// SetInjector installs inj, called before every mutating operation (see
// Injector); nil removes it. The injector is called with the FS locked, so it
// must not call methods of the FS.
func (fs *FS) SetInjector(inj Injector) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.inject = inj
}

// UnsyncedMode says what CrashClone does with file data written after the
// file's last Sync.
type UnsyncedMode int

const (
	// DropUnsynced keeps only the synced data of every file.
	DropUnsynced UnsyncedMode = iota
	// KeepRandomPrefix keeps, for a file whose current data extends its
	// synced data (synced is a prefix of current), the synced data plus a
	// random-length prefix (possibly empty or complete) of the unsynced tail.
	// Other files keep their synced data.
	KeepRandomPrefix
	// KeepRandomPrefixZeroed is KeepRandomPrefix, except that with
	// probability 1/2 per file the kept unsynced bytes read as zeros: the
	// size grew but the data never landed (delayed allocation).
	KeepRandomPrefixZeroed
)

// CrashConfig configures CrashClone.
type CrashConfig struct {
	// Rand is the source of randomness for the KeepRandomPrefix modes;
	// nil uses math/rand/v2's global source. Files are visited in sorted
	// path order, so a seeded Rand gives reproducible clones.
	Rand *rand.Rand
	// UnsyncedMode says what happens to unsynced file data.
	UnsyncedMode UnsyncedMode
}

// CrashClone returns a new, independent FS holding what would survive a
// power loss now: the entries of every directory as of its last SyncDir
// (recursively from the root), each file holding its data as of its last Sync
// plus, depending on cfg.UnsyncedMode, part of its unsynced data. A truncate
// or overwrite not synced since is lost. The clone is fully synced and has
// no injector; the receiver is unchanged.
func (fs *FS) CrashClone(cfg CrashConfig) *FS {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	intN := rand.IntN
	if cfg.Rand != nil {
		intN = cfg.Rand.IntN
	}
	files := map[*inode]*inode{}
	dirs := map[*dir]*dir{}
	cloneFile := func(ino *inode) *inode {
		if c, ok := files[ino]; ok {
			return c
		}
		data := bytes.Clone(ino.synced)
		if cfg.UnsyncedMode != DropUnsynced && len(ino.data) > len(ino.synced) &&
			bytes.HasPrefix(ino.data, ino.synced) {
			n := intN(len(ino.data) - len(ino.synced) + 1)
			tail := ino.data[len(ino.synced) : len(ino.synced)+n]
			if cfg.UnsyncedMode == KeepRandomPrefixZeroed && intN(2) == 0 {
				tail = make([]byte, n)
			}
			data = append(data, tail...)
		}
		c := &inode{data: data, synced: bytes.Clone(data)}
		files[ino] = c
		return c
	}
	var cloneDir func(d *dir) *dir
	cloneDir = func(d *dir) *dir {
		if c, ok := dirs[d]; ok {
			return c
		}
		c := newDir()
		dirs[d] = c
		for _, name := range slices.Sorted(maps.Keys(d.synced)) {
			if e := d.synced[name]; e.file != nil {
				c.entries[name] = entry{file: cloneFile(e.file)}
			} else {
				c.entries[name] = entry{dir: cloneDir(e.dir)}
			}
		}
		c.synced = maps.Clone(c.entries)
		return c
	}
	return &FS{root: cloneDir(fs.root)}
}

// lookupFile returns the inode of the file at name.
func (fs *FS) lookupFile(op, name string) (*inode, error) {
	d, base, err := fs.parent(clean(name))
	if err != nil {
		return nil, pathErr(op, name, err)
	}
	e, ok := d.entries[base]
	switch {
	case !ok:
		return nil, pathErr(op, name, os.ErrNotExist)
	case e.dir != nil:
		return nil, pathErr(op, name, syscall.EISDIR)
	}
	return e.file, nil
}

// Corrupt XORs the byte at off of the file at name with xor, in both its
// current and its synced data (bit rot on the medium). It fails if off is
// beyond both. Not injected.
func (fs *FS) Corrupt(name string, off int64, xor byte) error {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	ino, err := fs.lookupFile("corrupt", name)
	if err != nil {
		return err
	}
	if off < 0 || (off >= int64(len(ino.data)) && off >= int64(len(ino.synced))) {
		return pathErr("corrupt", name, syscall.EINVAL)
	}
	if off < int64(len(ino.data)) {
		ino.data[off] ^= xor
	}
	if off < int64(len(ino.synced)) {
		ino.synced[off] ^= xor
	}
	return nil
}

// ReadFile returns a copy of the current contents of the file at name.
func (fs *FS) ReadFile(name string) ([]byte, error) {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	ino, err := fs.lookupFile("open", name)
	if err != nil {
		return nil, err
	}
	return bytes.Clone(ino.data), nil
}

// file is an open handle; its fields other than closed are immutable, and
// closed and the inode are guarded by fs.mu.
type file struct {
	fs          *FS
	ino         *inode
	name        string
	read, write bool
	closed      bool
}

// check returns the error for op on f, if any, with f.fs.mu held.
func (f *file) check(op string, needWrite bool) error {
	switch {
	case f.closed:
		return pathErr(op, f.name, os.ErrClosed)
	case needWrite && !f.write, op == "read" && !f.read:
		return pathErr(op, f.name, syscall.EBADF)
	}
	return nil
}

// ReadAt reads like os.File.ReadAt: n < len(p) comes with io.EOF.
func (f *file) ReadAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("read", false); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, pathErr("readat", f.name, syscall.EINVAL)
	}
	if len(p) == 0 {
		return 0, nil
	}
	if off >= int64(len(f.ino.data)) {
		return 0, io.EOF
	}
	n := copy(p, f.ino.data[off:])
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// WriteAt writes p at off, extending the file with zeros if off is past its
// end. Injected as OpWrite (see ShortWriteError).
func (f *file) WriteAt(p []byte, off int64) (int, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("write", true); err != nil {
		return 0, err
	}
	if off < 0 {
		return 0, pathErr("writeat", f.name, syscall.EINVAL)
	}
	if len(p) == 0 {
		return 0, nil
	}
	var werr error
	if err := f.fs.injectLocked(OpWrite, clean(f.name)); err != nil {
		var sw *ShortWriteError
		if !errors.As(err, &sw) {
			return 0, err
		}
		p = p[:min(max(sw.N, 0), len(p))]
		if werr = sw.Err; werr == nil {
			werr = io.ErrShortWrite
		}
	}
	if end := off + int64(len(p)); end > int64(len(f.ino.data)) {
		f.ino.data = append(f.ino.data, make([]byte, end-int64(len(f.ino.data)))...)
	}
	copy(f.ino.data[off:], p)
	return len(p), werr
}

// Sync makes the file's current data durable. Injected as OpSync.
func (f *file) Sync() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("sync", false); err != nil {
		return err
	}
	if err := f.fs.injectLocked(OpSync, clean(f.name)); err != nil {
		return err
	}
	f.ino.synced = bytes.Clone(f.ino.data)
	return nil
}

// Truncate changes the file's size, extending it with zeros. Injected as
// OpTruncate.
func (f *file) Truncate(size int64) error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("truncate", true); err != nil {
		return err
	}
	if size < 0 {
		return pathErr("truncate", f.name, syscall.EINVAL)
	}
	if err := f.fs.injectLocked(OpTruncate, clean(f.name)); err != nil {
		return err
	}
	if n := int64(len(f.ino.data)); size <= n {
		f.ino.data = f.ino.data[:size]
	} else {
		f.ino.data = append(f.ino.data, make([]byte, size-n)...)
	}
	return nil
}

// Size returns the file's current length.
func (f *file) Size() (int64, error) {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("stat", false); err != nil {
		return 0, err
	}
	return int64(len(f.ino.data)), nil
}

// Close closes the handle; later operations on it fail with os.ErrClosed.
func (f *file) Close() error {
	f.fs.mu.Lock()
	defer f.fs.mu.Unlock()
	if err := f.check("close", false); err != nil {
		return err
	}
	f.closed = true
	return nil
}
