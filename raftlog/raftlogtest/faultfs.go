// Package raftlogtest holds fakes for testing code that uses package raftlog.
package raftlogtest

import (
	"io/fs"
	"sync"

	"github.com/lodestone-kv/lodestone/raftlog"
)

// Op names one operation of raftlog.FS, raftlog.File or raftlog.RandomFile.
type Op string

// The operations FaultFS can fail. Where File and RandomFile have the same
// kind of operation they share an Op; the path tells the files apart.
const (
	OpMkdirAll   Op = "mkdirall"
	OpCreateTemp Op = "createtemp"
	OpOpenFile   Op = "openfile"
	OpReadFile   Op = "readfile"
	OpStat       Op = "stat" // FS.Stat and RandomFile.Stat
	OpRename     Op = "rename"
	OpRemove     Op = "remove"
	OpReadDir    Op = "readdir"
	OpSyncDir    Op = "syncdir"
	OpWrite      Op = "write" // File.Write and RandomFile.WriteAt
	OpRead       Op = "read"  // RandomFile.ReadAt
	OpAllocate   Op = "allocate"
	OpTruncate   Op = "truncate"
	OpSync       Op = "sync" // File.Sync and RandomFile.Sync (fsync)
	OpDatasync   Op = "datasync"
	OpClose      Op = "close"
)

// FaultFS is a raftlog.FS that forwards to Inner unless a hook says
// otherwise. It is safe for concurrent use; hooks are called without locks.
type FaultFS struct {
	// Inner performs the operations; nil means raftlog.OSFS{}.
	Inner raftlog.FS

	// Fail, if set, is called before every operation with the path it
	// concerns (for Rename, the old path; for File operations, the file's
	// name). A non-nil result is returned instead of performing it.
	Fail func(op Op, path string) error

	// ShortWrite, if set and true for a File.Write or RandomFile.WriteAt,
	// writes only the first half of the buffer and reports that count with
	// a nil error.
	ShortWrite func(path string) bool

	mu    sync.Mutex
	calls map[Op]int
}

var _ raftlog.FS = (*FaultFS)(nil)

// Calls returns how many times op was attempted (failed attempts included).
func (f *FaultFS) Calls(op Op) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

func (f *FaultFS) before(op Op, path string) error {
	f.mu.Lock()
	if f.calls == nil {
		f.calls = make(map[Op]int)
	}
	f.calls[op]++
	f.mu.Unlock()
	if f.Fail != nil {
		return f.Fail(op, path)
	}
	return nil
}

func (f *FaultFS) inner() raftlog.FS {
	if f.Inner == nil {
		return raftlog.OSFS{}
	}
	return f.Inner
}

// MkdirAll implements raftlog.FS.
func (f *FaultFS) MkdirAll(dir string, perm fs.FileMode) error {
	if err := f.before(OpMkdirAll, dir); err != nil {
		return err
	}
	return f.inner().MkdirAll(dir, perm)
}

// CreateTemp implements raftlog.FS.
func (f *FaultFS) CreateTemp(dir, pattern string) (raftlog.File, error) {
	if err := f.before(OpCreateTemp, dir); err != nil {
		return nil, err
	}
	file, err := f.inner().CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return &faultFile{File: file, fs: f}, nil
}

// OpenFile implements raftlog.FS.
func (f *FaultFS) OpenFile(name string, flag int, perm fs.FileMode) (raftlog.RandomFile, error) {
	if err := f.before(OpOpenFile, name); err != nil {
		return nil, err
	}
	file, err := f.inner().OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	return &faultRandomFile{RandomFile: file, fs: f}, nil
}

// ReadFile implements raftlog.FS.
func (f *FaultFS) ReadFile(name string) ([]byte, error) {
	if err := f.before(OpReadFile, name); err != nil {
		return nil, err
	}
	return f.inner().ReadFile(name)
}

// Stat implements raftlog.FS.
func (f *FaultFS) Stat(name string) (fs.FileInfo, error) {
	if err := f.before(OpStat, name); err != nil {
		return nil, err
	}
	return f.inner().Stat(name)
}

// Rename implements raftlog.FS.
func (f *FaultFS) Rename(oldpath, newpath string) error {
	if err := f.before(OpRename, oldpath); err != nil {
		return err
	}
	return f.inner().Rename(oldpath, newpath)
}

// Remove implements raftlog.FS.
func (f *FaultFS) Remove(name string) error {
	if err := f.before(OpRemove, name); err != nil {
		return err
	}
	return f.inner().Remove(name)
}

// ReadDir implements raftlog.FS.
func (f *FaultFS) ReadDir(dir string) ([]fs.DirEntry, error) {
	if err := f.before(OpReadDir, dir); err != nil {
		return nil, err
	}
	return f.inner().ReadDir(dir)
}

// SyncDir implements raftlog.FS.
func (f *FaultFS) SyncDir(dir string) error {
	if err := f.before(OpSyncDir, dir); err != nil {
		return err
	}
	return f.inner().SyncDir(dir)
}

type faultFile struct {
	raftlog.File
	fs *FaultFS
}

func (f *faultFile) Write(p []byte) (int, error) {
	if err := f.fs.before(OpWrite, f.Name()); err != nil {
		return 0, err
	}
	if f.fs.ShortWrite != nil && f.fs.ShortWrite(f.Name()) {
		return f.File.Write(p[:len(p)/2])
	}
	return f.File.Write(p)
}

func (f *faultFile) Sync() error {
	if err := f.fs.before(OpSync, f.Name()); err != nil {
		return err
	}
	return f.File.Sync()
}

func (f *faultFile) Close() error {
	if err := f.fs.before(OpClose, f.Name()); err != nil {
		_ = f.File.Close() // do not leak the descriptor in tests
		return err
	}
	return f.File.Close()
}

type faultRandomFile struct {
	raftlog.RandomFile
	fs *FaultFS
}

func (f *faultRandomFile) ReadAt(p []byte, off int64) (int, error) {
	if err := f.fs.before(OpRead, f.Name()); err != nil {
		return 0, err
	}
	return f.RandomFile.ReadAt(p, off)
}

func (f *faultRandomFile) WriteAt(p []byte, off int64) (int, error) {
	if err := f.fs.before(OpWrite, f.Name()); err != nil {
		return 0, err
	}
	if f.fs.ShortWrite != nil && f.fs.ShortWrite(f.Name()) {
		return f.RandomFile.WriteAt(p[:len(p)/2], off)
	}
	return f.RandomFile.WriteAt(p, off)
}

func (f *faultRandomFile) Stat() (fs.FileInfo, error) {
	if err := f.fs.before(OpStat, f.Name()); err != nil {
		return nil, err
	}
	return f.RandomFile.Stat()
}

func (f *faultRandomFile) Allocate(size int64) error {
	if err := f.fs.before(OpAllocate, f.Name()); err != nil {
		return err
	}
	return f.RandomFile.Allocate(size)
}

func (f *faultRandomFile) Truncate(size int64) error {
	if err := f.fs.before(OpTruncate, f.Name()); err != nil {
		return err
	}
	return f.RandomFile.Truncate(size)
}

func (f *faultRandomFile) Sync() error {
	if err := f.fs.before(OpSync, f.Name()); err != nil {
		return err
	}
	return f.RandomFile.Sync()
}

func (f *faultRandomFile) Datasync() error {
	if err := f.fs.before(OpDatasync, f.Name()); err != nil {
		return err
	}
	return f.RandomFile.Datasync()
}

func (f *faultRandomFile) Close() error {
	if err := f.fs.before(OpClose, f.Name()); err != nil {
		_ = f.RandomFile.Close() // do not leak the descriptor in tests
		return err
	}
	return f.RandomFile.Close()
}
