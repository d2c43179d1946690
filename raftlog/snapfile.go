package raftlog

import (
	"bufio"
	"cmp"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// writeSnapFile writes what write produces to snap/<index>-<term>.snap
// crash-safely: write a temporary file, fsync it, rename it into place,
// fsync the directory. It returns the path, the data's size and CRC. On
// error nothing is left behind under the final name unless the final
// directory sync failed after the rename, in which case the file is removed
// (or, failing that, ignored and removed by the next Open, since raft.db does
// not reference it). The caller holds snapMu.
func (l *Log) writeSnapFile(index, term uint64, write func(io.Writer) error) (path string, size int64, crc uint32, err error) {
	path = filepath.Join(l.snapDir, snapFileName(index, term))
	f, err := l.fs.CreateTemp(l.snapDir, snapFileName(index, term)+".*.tmp")
	if err != nil {
		return "", 0, 0, fmt.Errorf("create temp snapshot file: %w", err)
	}
	tmp := f.Name()
	closed := false
	defer func() {
		if err == nil {
			return
		}
		if !closed {
			_ = f.Close()
		}
		if rerr := l.fs.Remove(tmp); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
			l.logger.Warn("raftlog: remove temp snapshot file", "path", tmp, "err", rerr)
		}
	}()
	sw := &snapWriter{f: f}
	// NB: buffered so an encoder's small writes do not each cost a system
	// call.
	bw := bufio.NewWriterSize(sw, snapWriteBuffer)
	if err := write(bw); err != nil {
		return "", 0, 0, fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := bw.Flush(); err != nil {
		return "", 0, 0, fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		return "", 0, 0, fmt.Errorf("sync %s: %w", tmp, err)
	}
	closed = true
	if err := f.Close(); err != nil {
		return "", 0, 0, fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := l.fs.Rename(tmp, path); err != nil {
		return "", 0, 0, fmt.Errorf("rename %s: %w", tmp, err)
	}
	if err := l.fs.SyncDir(l.snapDir); err != nil {
		if rerr := l.fs.Remove(path); rerr != nil {
			l.logger.Warn("raftlog: remove unsynced snapshot file", "path", path, "err", rerr)
		}
		return "", 0, 0, fmt.Errorf("sync dir %s: %w", l.snapDir, err)
	}
	return path, sw.n, sw.crc, nil
}

// snapWriteBuffer is the write buffer of a snapshot data file.
const snapWriteBuffer = 256 << 10

// snapSyncBytes is how much of a snapshot data file is written between two
// fsyncs of it. NB: flushed by one fsync at the end, a snapshot of tens of
// MB went to the disk in one burst, and every journal fdatasync on the
// same disk queued behind it; in steps, each one waits for one step.
const snapSyncBytes = 4 << 20

// snapWriter writes to a snapshot data file, counting the bytes and their
// CRC, and fsyncs it every snapSyncBytes; a short write without an error is
// io.ErrShortWrite.
type snapWriter struct {
	f        File
	n        int64
	crc      uint32
	unsynced int64
}

func (w *snapWriter) Write(p []byte) (int, error) {
	n, err := w.f.Write(p)
	w.n += int64(n)
	w.crc = crc32.Update(w.crc, castagnoli, p[:n])
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	if w.unsynced += int64(n); err == nil && w.unsynced >= snapSyncBytes {
		w.unsynced = 0
		if err = w.f.Sync(); err != nil {
			err = fmt.Errorf("sync: %w", err)
		}
	}
	return n, err
}

// pruneSnapshots removes from snap/ the temporary files, the data files above
// the current snapshot (written but never recorded) and all but the newest
// SnapshotsRetained data files at or below it. Files it does not recognize
// are left alone. Failures are logged, not returned: a leftover file costs
// space, not correctness. The caller holds snapMu (or is Open).
func (l *Log) pruneSnapshots() {
	l.mu.RLock()
	cur := l.snap.meta
	l.mu.RUnlock()
	entries, err := l.fs.ReadDir(l.snapDir)
	if err != nil {
		l.logger.Warn("raftlog: list snapshot dir", "dir", l.snapDir, "err", err)
		return
	}
	type snapFile struct {
		name        string
		index, term uint64
	}
	var keep []snapFile
	var remove []string
	current := snapFileName(cur.Index, cur.Term)
	for _, e := range entries {
		name := e.Name()
		if strings.HasSuffix(name, ".tmp") {
			remove = append(remove, name)
			continue
		}
		index, term, ok := parseSnapFileName(name)
		switch {
		case !ok || name == current:
		case index > cur.Index || cur.Index == 0:
			remove = append(remove, name)
		default:
			keep = append(keep, snapFile{name, index, term})
		}
	}
	// Newest first; the current file (not in keep) takes one retained slot.
	slices.SortFunc(keep, func(a, b snapFile) int {
		if c := cmp.Compare(b.index, a.index); c != 0 {
			return c
		}
		return cmp.Compare(b.term, a.term)
	})
	if n := l.opts.SnapshotsRetained - 1; len(keep) > n {
		for _, f := range keep[n:] {
			remove = append(remove, f.name)
		}
	}
	for _, name := range remove {
		path := filepath.Join(l.snapDir, name)
		if err := l.fs.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			l.logger.Warn("raftlog: remove old snapshot file", "path", path, "err", err)
			continue
		}
		l.logger.Debug("raftlog: removed snapshot file", "path", path)
	}
}
