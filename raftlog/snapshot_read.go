package raftlog

import (
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"

	"go.etcd.io/raft/v3/raftpb"
)

// ErrNoSnapshot is returned by OpenSnapshot when no snapshot is recorded.
var ErrNoSnapshot = errors.New("raftlog: no snapshot recorded")

// SnapshotReader reads the data of one recorded snapshot from its file,
// checking its length and CRC as it goes: the Read that reaches the end
// returns an error wrapping ErrCorrupt instead of io.EOF if the file does
// not match its record. Read the data to io.EOF to have it checked. It is
// not safe for concurrent use.
type SnapshotReader struct {
	meta raftpb.SnapshotMetadata
	path string
	f    RandomFile
	r    *io.SectionReader
	size int64
	want uint32
	crc  uint32
	read int64
}

// OpenSnapshot opens the current snapshot's data file for reading
// (ErrNoSnapshot if none is recorded). The reader keeps the file open, so a
// later snapshot that removes it (Options.SnapshotsRetained) does not cut
// the read short. It never waits for a snapshot being written. The caller
// closes it.
func (l *Log) OpenSnapshot() (*SnapshotReader, error) {
	for {
		l.mu.RLock()
		rec, closed := l.snap, l.closed
		l.mu.RUnlock()
		switch {
		case closed:
			return nil, ErrClosed
		case rec.meta.Index == 0:
			return nil, ErrNoSnapshot
		}
		r, err := l.openSnapFile(rec)
		if errors.Is(err, os.ErrNotExist) && l.snapChanged(rec) {
			continue // NB: a newer snapshot was recorded and this one removed
		}
		return r, err
	}
}

// snapChanged reports whether the current snapshot is no longer rec.
func (l *Log) snapChanged(rec snapRecord) bool {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.snap.meta.Index != rec.meta.Index || l.snap.meta.Term != rec.meta.Term
}

func (l *Log) openSnapFile(rec snapRecord) (*SnapshotReader, error) {
	path := filepath.Join(l.snapDir, snapFileName(rec.meta.Index, rec.meta.Term))
	f, err := l.fs.OpenFile(path, os.O_RDONLY, 0)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, &CorruptError{Path: path, Record: "snapshot file", Index: rec.meta.Index, Detail: "missing", Err: err}
	case err != nil:
		return nil, fmt.Errorf("raftlog: open snapshot: %w", err)
	}
	fi, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("raftlog: stat snapshot: %w", err)
	}
	if uint64(fi.Size()) != rec.dataLen {
		_ = f.Close()
		return nil, &CorruptError{Path: path, Record: "snapshot file", Index: rec.meta.Index,
			Detail: fmt.Sprintf("size %d, recorded %d", fi.Size(), rec.dataLen)}
	}
	size := int64(rec.dataLen)
	return &SnapshotReader{meta: cloneSnapMeta(rec.meta), path: path, f: f,
		r: io.NewSectionReader(f, 0, size), size: size, want: rec.dataCRC}, nil
}

// Metadata is the snapshot's index, term and conf state.
func (r *SnapshotReader) Metadata() raftpb.SnapshotMetadata { return cloneSnapMeta(r.meta) }

// Size is the length of the data in bytes.
func (r *SnapshotReader) Size() int64 { return r.size }

// Read follows io.Reader.
func (r *SnapshotReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	r.crc = crc32.Update(r.crc, castagnoli, p[:n])
	r.read += int64(n)
	if errors.Is(err, io.EOF) {
		if cerr := r.check(); cerr != nil {
			return n, cerr
		}
	}
	return n, err
}

func (r *SnapshotReader) check() error {
	if r.read != r.size {
		return &CorruptError{Path: r.path, Record: "snapshot file", Index: r.meta.Index,
			Detail: fmt.Sprintf("read %d bytes, recorded %d", r.read, r.size)}
	}
	if r.crc != r.want {
		return &CorruptError{Path: r.path, Record: "snapshot file", Index: r.meta.Index,
			Detail: fmt.Sprintf("checksum mismatch (recorded %#08x, computed %#08x)", r.want, r.crc)}
	}
	return nil
}

// Close closes the file.
func (r *SnapshotReader) Close() error { return r.f.Close() }

// OpenShared opens a second, read-only handle on the snapshot's data file
// on the real filesystem, for a reader that keeps reading the data at
// offsets after this reader is closed (the store leaves a restored
// snapshot's values in it). The handle keeps the data readable after a
// later snapshot removes the file. It is not checked: read this reader to
// its end first. Behind an FS that is not the real filesystem it fails.
func (r *SnapshotReader) OpenShared() (*os.File, error) {
	f, err := os.Open(r.path)
	if err != nil {
		return nil, fmt.Errorf("raftlog: open snapshot for shared reads: %w", err)
	}
	if fi, err := f.Stat(); err != nil || fi.Size() != r.size {
		_ = f.Close()
		return nil, fmt.Errorf("raftlog: open snapshot for shared reads: %s is not the file being read", r.path)
	}
	return f, nil
}

// ReadSnapshotData reads the whole data of the current snapshot into memory
// and checks it, for callers that need it as one slice (tools, tests). The
// Log keeps no copy.
func (l *Log) ReadSnapshotData() (raftpb.Snapshot, error) {
	r, err := l.OpenSnapshot()
	if errors.Is(err, ErrNoSnapshot) {
		return raftpb.Snapshot{}, nil
	}
	if err != nil {
		return raftpb.Snapshot{}, err
	}
	defer r.Close()
	data := make([]byte, 0, r.Size())
	buf := make([]byte, 64<<10)
	for {
		n, err := r.Read(buf)
		data = append(data, buf[:n]...)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return raftpb.Snapshot{}, err
		}
	}
	return raftpb.Snapshot{Metadata: r.Metadata(), Data: data}, nil
}
