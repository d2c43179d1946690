package raftlog

import (
	"io/fs"
	"os"
)

// FS is the seam under the snapshot directory (dir/snap). Every file the Log
// writes besides raft.db goes through it, so tests can inject write, fsync,
// rename and directory-sync failures. raft.db itself is opened by bbolt on
// the real filesystem; bbolt cannot be faked and is not meant to be.
//
// Implementations must be safe for use by one goroutine at a time; the Log
// never calls an FS concurrently with itself.
type FS interface {
	// MkdirAll creates dir and any missing parents (os.MkdirAll).
	MkdirAll(dir string, perm fs.FileMode) error
	// CreateTemp creates a new file for writing in dir (os.CreateTemp).
	CreateTemp(dir, pattern string) (File, error)
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
