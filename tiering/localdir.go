package tiering

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"syscall"
)

// tmpPrefix starts the name of every temporary file LocalDir writes. Keys
// with a segment that starts with it are rejected, so List can skip them.
const tmpPrefix = ".tier-tmp-"

// LocalDir is an ObjectStore on a local directory: the embedded default
// tier (file://<data-dir>/tier). A key a/b/c is the file <root>/a/b/c.
// Writes are atomic and durable (temp file, fsync, rename, fsync dir).
//
// Unlike S3, a key cannot also be a "directory" of other keys: with a/b
// stored, a/b/c cannot be (and the reverse).
type LocalDir struct {
	root string
	// durable holds directories known to be durable in their parents (made
	// and synced here, or found made and synced once): a Put finding its
	// directory made by another Put syncs the parent once, not every time.
	durable sync.Map
}

var _ ObjectStore = (*LocalDir)(nil)

// NewLocalDir returns a store rooted at root, creating it if needed.
func NewLocalDir(root string) (*LocalDir, error) {
	if root == "" {
		return nil, errors.New("tiering: local dir: empty root")
	}
	abs, err := filepath.Abs(root)
	if err != nil {
		return nil, fmt.Errorf("tiering: local dir %q: %w", root, err)
	}
	if err := os.MkdirAll(abs, 0o755); err != nil {
		return nil, fmt.Errorf("tiering: local dir: %w", err)
	}
	fi, err := os.Stat(abs)
	if err != nil {
		return nil, fmt.Errorf("tiering: local dir: %w", err)
	}
	if !fi.IsDir() {
		return nil, fmt.Errorf("tiering: local dir %q: not a directory", abs)
	}
	sweepTemp(abs)
	return &LocalDir{root: abs}, nil
}

// sweepTemp removes temporary names a crash left behind (a half-written
// Put, or a hard link made by LinkFile before its rename): nothing lists
// them, so nothing else would ever delete them. The store is not in use
// yet when it is opened.
func sweepTemp(root string) {
	filepath.WalkDir(root, func(p string, de fs.DirEntry, err error) error {
		if err == nil && !de.IsDir() && strings.HasPrefix(de.Name(), tmpPrefix) {
			os.Remove(p)
		}
		return nil
	})
}

// Root returns the absolute directory the store lives in.
func (d *LocalDir) Root() string { return d.root }

// validKey rejects keys that could escape root or are ambiguous on a file
// system: empty, absolute, with empty, "." or ".." segments, backslashes,
// NUL bytes, or a segment that looks like one of our temp files.
func validKey(key string) error {
	if key == "" {
		return errors.New("empty key")
	}
	if strings.HasPrefix(key, "/") {
		return fmt.Errorf("key %q is absolute", key)
	}
	if strings.ContainsAny(key, "\\\x00") {
		return fmt.Errorf("key %q has a backslash or NUL byte", key)
	}
	for _, seg := range strings.Split(key, "/") {
		switch {
		case seg == "":
			return fmt.Errorf("key %q has an empty segment", key)
		case seg == "." || seg == "..":
			return fmt.Errorf("key %q has a %q segment", key, seg)
		case strings.HasPrefix(seg, tmpPrefix):
			return fmt.Errorf("key %q has a segment starting with reserved %q", key, tmpPrefix)
		}
	}
	return nil
}

func (d *LocalDir) path(key string) string {
	return filepath.Join(d.root, filepath.FromSlash(key))
}

// syncDir fsyncs a directory so entries created, renamed or removed in it
// are durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("fsync dir %s: %w", dir, err)
	}
	return nil
}

// mkdirs creates dir (below root) and its missing parents, fsyncing the
// parent of every directory it creates.
func (d *LocalDir) mkdirs(dir string) error {
	rel, err := filepath.Rel(d.root, dir)
	if err != nil {
		return err
	}
	if rel == "." {
		return nil
	}
	cur := d.root
	for _, seg := range strings.Split(rel, string(filepath.Separator)) {
		parent := cur
		cur = filepath.Join(cur, seg)
		err := os.Mkdir(cur, 0o755)
		if err == nil {
			if err := syncDir(parent); err != nil {
				return err
			}
			d.durable.Store(cur, true)
			continue
		}
		if errors.Is(err, fs.ErrExist) {
			fi, serr := os.Stat(cur)
			if serr == nil && fi.IsDir() {
				// Maybe made by a concurrent Put and not yet durable in its
				// parent: this Put's durability must not wait on that one.
				if _, ok := d.durable.Load(cur); !ok {
					if err := syncDir(parent); err != nil {
						return err
					}
					d.durable.Store(cur, true)
				}
				continue
			}
			if serr == nil {
				return fmt.Errorf("%s exists and is not a directory", cur)
			}
			err = serr
		}
		return err
	}
	return nil
}

// writeTemp writes size bytes of r to a new fsynced temp file in the
// directory of final and returns its path. It recreates missing directories
// if a concurrent Delete pruned them.
func (d *LocalDir) writeTemp(final string, r io.Reader, size int64) (string, error) {
	dir := filepath.Dir(final)
	var f *os.File
	var err error
	for attempt := 0; ; attempt++ {
		if err = d.mkdirs(dir); err == nil {
			f, err = os.CreateTemp(dir, tmpPrefix+"*")
			if err == nil {
				break
			}
		}
		// A concurrent Delete may prune a (then empty) directory
		// while it is being made or used: make it again.
		if !errors.Is(err, fs.ErrNotExist) || attempt >= 10 {
			return "", err
		}
	}
	tmp := f.Name()
	fail := func(err error) (string, error) {
		f.Close()
		os.Remove(tmp)
		return "", err
	}
	if size < 0 {
		return fail(fmt.Errorf("negative size %d", size))
	}
	src := io.LimitReader(r, size)
	var h hash.Hash32
	cb, known := r.(*crc32cBody)
	if known {
		// The bytes copied must be the ones checksummed before (the
		// manifest vouches for that checksum).
		h = crc32.New(castagnoli)
		src = io.TeeReader(src, h)
	}
	n, err := io.Copy(f, src)
	if err != nil {
		return fail(fmt.Errorf("write: %w", err))
	}
	if n != size {
		return fail(fmt.Errorf("short body: %d of %d bytes: %w", n, size, io.ErrUnexpectedEOF))
	}
	if known && h.Sum32() != cb.sum {
		return fail(fmt.Errorf("the body copied (crc32c %08x) is not the one checksummed before (%08x)", h.Sum32(), cb.sum))
	}
	if err := f.Sync(); err != nil {
		return fail(fmt.Errorf("fsync: %w", err))
	}
	if err := f.Close(); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return tmp, nil
}

// Put implements ObjectStore.
func (d *LocalDir) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := validKey(key); err != nil {
		return fmt.Errorf("local put: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("local put %q: %w", key, err)
	}
	final := d.path(key)
	tmp, err := d.writeTemp(final, r, size)
	if err != nil {
		return fmt.Errorf("local put %q: %w", key, err)
	}
	if err := os.Rename(tmp, final); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("local put %q: %w", key, err)
	}
	if err := syncDir(filepath.Dir(final)); err != nil {
		return fmt.Errorf("local put %q: %w", key, err)
	}
	return nil
}

// LinkFile implements FileLinker: the file becomes the object by a hard
// link (tmp name, then rename over the key, then fsync the directory), so a
// sealed segment on the same file system is stored without copying a byte.
// The caller guarantees the file is never written again.
func (d *LocalDir) LinkFile(ctx context.Context, key, path string, size int64) error {
	if err := validKey(key); err != nil {
		return fmt.Errorf("local link: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("local link %q: %w", key, err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		return fmt.Errorf("local link %q: %w", key, err)
	}
	if fi.Size() != size {
		return fmt.Errorf("local link %q: %s has %d bytes, want %d", key, path, fi.Size(), size)
	}
	// The source's directory first: a sealed segment's successor must not
	// vanish in a crash, or the sealed file would become the last segment
	// again and take appends (and the object is the same inode).
	if err := syncDir(filepath.Dir(path)); err != nil {
		return fmt.Errorf("local link %q: %w", key, err)
	}
	final := d.path(key)
	dir := filepath.Dir(final)
	if err := d.mkdirs(dir); err != nil {
		return fmt.Errorf("local link %q: %w", key, err)
	}
	if ffi, err := os.Stat(final); err == nil && os.SameFile(fi, ffi) {
		return syncDir(dir) // linked already (a pass whose manifest did not commit)
	}
	var rnd [8]byte
	rand.Read(rnd[:])
	tmp := filepath.Join(dir, tmpPrefix+hex.EncodeToString(rnd[:]))
	if err := os.Link(path, tmp); err != nil {
		return fmt.Errorf("local link %q: %w", key, err)
	}
	err = os.Rename(tmp, final)
	// Renaming a link over another link to the same inode does nothing and
	// leaves tmp: remove it either way.
	os.Remove(tmp)
	if err != nil {
		return fmt.Errorf("local link %q: %w", key, err)
	}
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("local link %q: %w", key, err)
	}
	return nil
}

// PutIfAbsent implements ObjectStore. The final name is created with a hard
// link, which fails atomically if it exists.
func (d *LocalDir) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := validKey(key); err != nil {
		return fmt.Errorf("local put-if-absent: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("local put-if-absent %q: %w", key, err)
	}
	final := d.path(key)
	if _, err := os.Lstat(final); err == nil {
		return fmt.Errorf("local put-if-absent %q: %w", key, ErrExists)
	}
	tmp, err := d.writeTemp(final, r, size)
	if err != nil {
		return fmt.Errorf("local put-if-absent %q: %w", key, err)
	}
	lerr := os.Link(tmp, final)
	os.Remove(tmp)
	if lerr != nil {
		if errors.Is(lerr, fs.ErrExist) {
			return fmt.Errorf("local put-if-absent %q: %w", key, ErrExists)
		}
		return fmt.Errorf("local put-if-absent %q: %w", key, lerr)
	}
	if err := syncDir(filepath.Dir(final)); err != nil {
		return fmt.Errorf("local put-if-absent %q: %w", key, err)
	}
	return nil
}

// GetRange implements ObjectStore.
func (d *LocalDir) GetRange(ctx context.Context, key string, off, n int64) ([]byte, error) {
	if err := validKey(key); err != nil {
		return nil, fmt.Errorf("local get: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("local get %q: %w", key, err)
	}
	f, err := os.Open(d.path(key))
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil, fmt.Errorf("local get %q: %w", key, ErrNotFound)
		}
		return nil, fmt.Errorf("local get %q: %w", key, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("local get %q: %w", key, err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("local get %q: %w", key, ErrNotFound)
	}
	n, err = checkRange(key, fi.Size(), off, n)
	if err != nil {
		return nil, fmt.Errorf("local %w", err)
	}
	buf := make([]byte, n)
	if _, err := f.ReadAt(buf, off); err != nil && !(errors.Is(err, io.EOF) && n == 0) {
		return nil, fmt.Errorf("local get %q [%d,+%d): %w", key, off, n, err)
	}
	return buf, nil
}

// Delete implements ObjectStore. It also removes the directories the
// deletion leaves empty (up to, not including, root).
func (d *LocalDir) Delete(ctx context.Context, key string) error {
	if err := validKey(key); err != nil {
		return fmt.Errorf("local delete: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("local delete %q: %w", key, err)
	}
	final := d.path(key)
	fi, err := os.Lstat(final)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			return nil
		}
		return fmt.Errorf("local delete %q: %w", key, err)
	}
	if fi.IsDir() {
		// a/b is a "directory" of other keys, not an object: nothing to do.
		return nil
	}
	if err := os.Remove(final); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		return fmt.Errorf("local delete %q: %w", key, err)
	}
	dir := filepath.Dir(final)
	if err := syncDir(dir); err != nil {
		return fmt.Errorf("local delete %q: %w", key, err)
	}
	// Prune empty parents, best effort: Remove fails on a non-empty
	// directory, and a concurrent Put recreates what it needs.
	for dir != d.root {
		d.durable.Delete(dir) // first: a Put finding it made again syncs
		if os.Remove(dir) != nil {
			break
		}
		parent := filepath.Dir(dir)
		_ = syncDir(parent)
		dir = parent
	}
	return nil
}

// List implements ObjectStore. The prefix may end in the middle of a
// segment ("a/b/seg" lists "a/b/segment-1"); temp files are never listed.
func (d *LocalDir) List(ctx context.Context, prefix string) ([]string, error) {
	if strings.HasPrefix(prefix, "/") || strings.ContainsAny(prefix, "\\\x00") {
		return nil, fmt.Errorf("local list: invalid prefix %q", prefix)
	}
	for _, seg := range strings.Split(prefix, "/") {
		if seg == "." || seg == ".." {
			return nil, fmt.Errorf("local list: invalid prefix %q", prefix)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("local list %q: %w", prefix, err)
	}
	// Walk the deepest directory the prefix names whole.
	start := d.root
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = d.path(prefix[:i])
	}
	var keys []string
	err := filepath.WalkDir(start, func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
				// Start missing (or a file), or a directory pruned
				// by a concurrent Delete while walking.
				if p == start {
					return fs.SkipAll
				}
				return nil
			}
			return err
		}
		if p == start {
			return nil
		}
		name := e.Name()
		if strings.HasPrefix(name, tmpPrefix) {
			return nil
		}
		rel, err := filepath.Rel(d.root, p)
		if err != nil {
			return err
		}
		key := filepath.ToSlash(rel)
		if e.IsDir() {
			// Skip subtrees that cannot hold a matching key.
			if !strings.HasPrefix(key+"/", prefix) && !strings.HasPrefix(prefix, key+"/") {
				return fs.SkipDir
			}
			return nil
		}
		if e.Type().IsRegular() && strings.HasPrefix(key, prefix) {
			keys = append(keys, key)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("local list %q: %w", prefix, err)
	}
	sort.Strings(keys)
	return keys, nil
}
