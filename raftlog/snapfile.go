package raftlog

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// writeSnapFile writes data to snap/<index>-<term>.snap crash-safely: write a
// temporary file, fsync it, rename it into place, fsync the directory. On
// error nothing is left behind under the final name unless the final
// directory sync failed after the rename, in which case the file is removed
// (or, failing that, ignored and removed by the next Open, since raft.db does
// not reference it). The caller holds snapMu.
func (l *Log) writeSnapFile(index, term uint64, data []byte) (path string, err error) {
	path = filepath.Join(l.snapDir, snapFileName(index, term))
	f, err := l.fs.CreateTemp(l.snapDir, snapFileName(index, term)+".*.tmp")
	if err != nil {
		return "", fmt.Errorf("create temp snapshot file: %w", err)
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
	n, err := f.Write(data)
	if err == nil && n < len(data) {
		err = io.ErrShortWrite
	}
	if err != nil {
		return "", fmt.Errorf("write %s: %w", tmp, err)
	}
	if err := f.Sync(); err != nil {
		return "", fmt.Errorf("sync %s: %w", tmp, err)
	}
	closed = true
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("close %s: %w", tmp, err)
	}
	if err := l.fs.Rename(tmp, path); err != nil {
		return "", fmt.Errorf("rename %s: %w", tmp, err)
	}
	if err := l.fs.SyncDir(l.snapDir); err != nil {
		if rerr := l.fs.Remove(path); rerr != nil {
			l.logger.Warn("raftlog: remove unsynced snapshot file", "path", path, "err", rerr)
		}
		return "", fmt.Errorf("sync dir %s: %w", l.snapDir, err)
	}
	return path, nil
}

// readSnapFile reads the data file of rec and checks its size and CRC.
func (l *Log) readSnapFile(rec snapRecord) ([]byte, error) {
	path := filepath.Join(l.snapDir, snapFileName(rec.meta.Index, rec.meta.Term))
	data, err := l.fs.ReadFile(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, &CorruptError{Path: path, Record: "snapshot file", Index: rec.meta.Index, Detail: "missing", Err: err}
	case err != nil:
		return nil, fmt.Errorf("raftlog: read snapshot: %w", err)
	case uint64(len(data)) != rec.dataLen:
		return nil, &CorruptError{Path: path, Record: "snapshot file", Index: rec.meta.Index,
			Detail: fmt.Sprintf("size %d, recorded %d", len(data), rec.dataLen)}
	}
	if got := checksum(data); got != rec.dataCRC {
		return nil, &CorruptError{Path: path, Record: "snapshot file", Index: rec.meta.Index,
			Detail: fmt.Sprintf("checksum mismatch (recorded %#08x, computed %#08x)", rec.dataCRC, got)}
	}
	return data, nil
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
