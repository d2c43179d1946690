package raftlog

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
)

// FS is the seam under every file of the log directory except raft.db: the
// journal raft.wal (OpenFile), the snapshot data files in dir/snap, the
// directory syncs of Open, and the rename and directory sync of a rotation.
// Tests inject write, fsync, rename and directory-sync failures through it
// (raftlogtest.FaultFS; FORMAT.md "Failure cases").
// raft.db itself is opened by bbolt on the real filesystem; bbolt cannot be
// faked and is not meant to be.
//
// Implementations must be safe for concurrent use: the Log calls its FS from
// Save (the journal, under the write lock), from CreateSnapshot and
// ApplySnapshot (snapshot files, without it) and from the rotation
// goroutine. Each File or RandomFile is used by one goroutine at a time.
type FS interface {
	// MkdirAll creates dir and any missing parents (os.MkdirAll).
	MkdirAll(dir string, perm fs.FileMode) error
	// CreateTemp creates a new file for writing in dir (os.CreateTemp).
	CreateTemp(dir, pattern string) (File, error)
	// OpenFile opens name for reading and writing at offsets (os.OpenFile,
	// with os.O_RDWR|os.O_CREATE for the Log's journal and os.O_RDONLY for
	// Inspect). A missing file without os.O_CREATE is an error wrapping
	// fs.ErrNotExist.
	OpenFile(name string, flag int, perm fs.FileMode) (RandomFile, error)
	// ReadFile returns the whole contents of name (os.ReadFile).
	ReadFile(name string) ([]byte, error)
	// Stat describes name (os.Stat).
	Stat(name string) (fs.FileInfo, error)
	// Rename atomically replaces newpath with oldpath (os.Rename).
	Rename(oldpath, newpath string) error
	// Remove deletes name (os.Remove).
	Remove(name string) error
	// ReadDir lists dir (os.ReadDir).
	ReadDir(dir string) ([]fs.DirEntry, error)
	// SyncDir makes the directory entries of dir durable (open + fsync).
	SyncDir(dir string) error
}

// File is a file being written through an FS.
type File interface {
	// Name is the full path of the file, as passed to Rename and Remove.
	Name() string
	// Write follows io.Writer; a short write without an error is reported by
	// the Log as io.ErrShortWrite.
	Write(p []byte) (int, error)
	// Sync flushes the file's data and metadata to stable storage (fsync).
	Sync() error
	// Close closes the file.
	Close() error
}

// RandomFile is a file read and written at offsets through an FS: the
// journal, raft.wal. The Log preallocates it once and then overwrites it in
// place, so that an fdatasync after a write has no file size to record.
type RandomFile interface {
	// Name is the path passed to OpenFile.
	Name() string
	// ReadAt follows io.ReaderAt.
	ReadAt(p []byte, off int64) (int, error)
	// WriteAt follows io.WriterAt; a short write without an error is
	// reported by the Log as io.ErrShortWrite. After a failed or short
	// WriteAt the bytes at [off, off+len(p)) are unknown: old, new or a mix.
	WriteAt(p []byte, off int64) (int, error)
	// Stat describes the file (os.File.Stat); the Log reads its size.
	Stat() (fs.FileInfo, error)
	// Allocate allocates disk blocks for the first size bytes of the file,
	// extending it if it is shorter (fallocate with mode 0). An error
	// wrapping errors.ErrUnsupported means the filesystem cannot; the Log
	// then extends the file with Truncate instead.
	Allocate(size int64) error
	// Truncate changes the size of the file (os.File.Truncate).
	Truncate(size int64) error
	// Sync flushes the file's data and metadata to stable storage (fsync).
	Sync() error
	// Datasync flushes the file's data, and only the metadata needed to read
	// it back, to stable storage (fdatasync; fsync where the system has no
	// fdatasync). After it fails, what reached the disk is unknown.
	Datasync() error
	// Close closes the file.
	Close() error
}

// OSFS is the FS of the operating system. Its zero value is ready to use.
type OSFS struct{}

var _ FS = OSFS{}

// MkdirAll implements FS.
func (OSFS) MkdirAll(dir string, perm fs.FileMode) error { return os.MkdirAll(dir, perm) }

// CreateTemp implements FS.
func (OSFS) CreateTemp(dir, pattern string) (File, error) {
	f, err := os.CreateTemp(dir, pattern)
	if err != nil {
		return nil, err
	}
	return f, nil
}

// OpenFile implements FS.
func (OSFS) OpenFile(name string, flag int, perm fs.FileMode) (RandomFile, error) {
	f, err := os.OpenFile(name, flag, perm)
	if err != nil {
		return nil, err
	}
	// NB: Fd is taken once, here: it puts the descriptor in blocking mode,
	// which a regular file is in anyway.
	return &osRandomFile{File: f, fd: int(f.Fd())}, nil
}

// ReadFile implements FS.
func (OSFS) ReadFile(name string) ([]byte, error) { return os.ReadFile(name) }

// Stat implements FS.
func (OSFS) Stat(name string) (fs.FileInfo, error) { return os.Stat(name) }

// Rename implements FS.
func (OSFS) Rename(oldpath, newpath string) error { return os.Rename(oldpath, newpath) }

// Remove implements FS.
func (OSFS) Remove(name string) error { return os.Remove(name) }

// ReadDir implements FS.
func (OSFS) ReadDir(dir string) ([]fs.DirEntry, error) { return os.ReadDir(dir) }

// SyncDir implements FS.
func (OSFS) SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		_ = d.Close()
		return err
	}
	return d.Close()
}

// osRandomFile is OSFS's RandomFile: an *os.File plus the two calls the os
// package lacks (fs_linux.go, fs_other.go), its fdatasync waited for
// without holding a thread where the kernel allows (diskwait_aio.go).
type osRandomFile struct {
	*os.File
	fd   int
	wait diskWait
}

// Allocate implements RandomFile.
func (f *osRandomFile) Allocate(size int64) error { return preallocate(f.fd, size) }

// Datasync implements RandomFile.
func (f *osRandomFile) Datasync() error { return f.wait.datasync(f.fd) }

// Close implements RandomFile.
func (f *osRandomFile) Close() error { return errors.Join(f.wait.close(), f.File.Close()) }

// DatasyncParks reports whether a Log in dir, in a process with one P,
// waits for its fdatasyncs parked in Go's poller, holding no thread
// (diskwait_aio.go), rather than inside a blocking system call. It tries
// one on dir, or on its nearest ancestor that exists.
func DatasyncParks(dir string) bool {
	for {
		d, err := os.Open(dir)
		if err == nil {
			defer d.Close()
			var w diskWait
			defer w.close()
			return w.park(int(d.Fd())) == nil && w.usesAIO()
		}
		up := filepath.Dir(dir)
		if up == dir {
			return false
		}
		dir = up
	}
}
