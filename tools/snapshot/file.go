// Package snapshot saves, inspects and restores operator snapshot files:
// a consistent copy of a cluster's replicated state, taken through the
// Admin service (`lodestone snapshot save`), checked offline (`snapshot
// inspect`), and turned into the data directory of a member of a new
// cluster (`snapshot restore`). It also turns a surviving node's data into
// a one-node cluster after quorum loss (Recover, `lodestone recover`).
//
// It owns the snapshot file format (below) and nothing else: the state
// itself is a store snapshot stream (store/SNAPSHOT.md) and the data
// directory is written through raftlog.
package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
)

// Snapshot file layout, version 1. All integers big-endian.
//
//	0        magic    [8]byte  "LDSTBKUP"
//	8        version  uint32   1
//	12       hlen     uint32   header length, at most maxHeaderBytes
//	16       header   lodestone.v1.SavedSnapshotHeader (deterministic protobuf)
//	16+hlen  data     header.size bytes: one store snapshot stream
//	end-32   sha256   [32]byte SHA-256 of every byte before it
//
// The file is complete only with its checksum: a file cut anywhere is
// refused as truncated, a changed byte as a checksum mismatch.
const (
	fileMagic      = "LDSTBKUP"
	fileVersion    = 1
	fileHeaderLen  = 16
	maxHeaderBytes = 1 << 20
)

// ErrDamaged is wrapped by every error for a snapshot file that is not a
// complete, intact snapshot.
var ErrDamaged = errors.New("snapshot: damaged file")

// DamagedError names the file and what is wrong with it. It wraps
// ErrDamaged (and the store's decode error, if that is what failed).
type DamagedError struct {
	Path   string
	Reason string
	Err    error
}

func (e *DamagedError) Error() string {
	if e.Err != nil {
		return fmt.Sprintf("snapshot file %s is damaged: %s: %v", e.Path, e.Reason, e.Err)
	}
	return fmt.Sprintf("snapshot file %s is damaged: %s", e.Path, e.Reason)
}

func (e *DamagedError) Unwrap() []error {
	if e.Err != nil {
		return []error{ErrDamaged, e.Err}
	}
	return []error{ErrDamaged}
}

// Info describes a snapshot file.
type Info struct {
	Path string `json:"path"`
	// Index and Term of the last entry the snapshot includes.
	Index uint64 `json:"index"`
	Term  uint64 `json:"term"`
	// Source is the member that took it.
	Source string `json:"source"`
	// Members as the replicated membership knew them, and which are voters.
	Members []Member `json:"members"`
	// Keys, Nodes, Services (instances), ServiceNames, Sessions: counts.
	Keys         int `json:"keys"`
	Nodes        int `json:"nodes"`
	Services     int `json:"services"`
	ServiceNames int `json:"service_names"`
	Sessions     int `json:"sessions"`
	// FileBytes is the file's size; DataBytes the state's encoded size.
	FileBytes int64  `json:"file_bytes"`
	DataBytes uint64 `json:"data_bytes"`
	// SHA256 is the file's checksum (its last 32 bytes), hex.
	SHA256 string `json:"sha256"`
}

// Member is one member in a snapshot.
type Member struct {
	ID       string `json:"id"`
	Name     string `json:"name"`
	PeerAddr string `json:"peer_addr"`
	Role     string `json:"role"` // voter, learner or "-" (not in the Raft configuration)
}

// encodeHeader returns the bytes of the file before the data.
func encodeHeader(h *lodestonepb.SavedSnapshotHeader) ([]byte, error) {
	hb, err := proto.MarshalOptions{Deterministic: true}.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot header: %w", err)
	}
	out := make([]byte, fileHeaderLen, fileHeaderLen+len(hb))
	copy(out, fileMagic)
	binary.BigEndian.PutUint32(out[8:], fileVersion)
	binary.BigEndian.PutUint32(out[12:], uint32(len(hb)))
	return append(out, hb...), nil
}

// parsed is a verified snapshot file.
type parsed struct {
	header *lodestonepb.SavedSnapshotHeader
	data   []byte
	sum    [32]byte
	size   int64
}

// readFile reads and verifies the file at path: layout, lengths and
// checksum. It does not decode the state (see loadStore).
func readFile(path string) (*parsed, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read snapshot file: %w", err)
	}
	bad := func(format string, args ...any) error {
		return &DamagedError{Path: path, Reason: fmt.Sprintf(format, args...)}
	}
	if len(b) < fileHeaderLen {
		return nil, bad("truncated: %d bytes, shorter than the %d-byte file header", len(b), fileHeaderLen)
	}
	if string(b[:8]) != fileMagic {
		return nil, bad("bad magic %q, want %q (not a lodestone snapshot file)", b[:8], fileMagic)
	}
	if v := binary.BigEndian.Uint32(b[8:]); v != fileVersion {
		return nil, bad("version %d unsupported (this build reads version %d)", v, fileVersion)
	}
	hlen := int(binary.BigEndian.Uint32(b[12:]))
	if hlen > maxHeaderBytes {
		return nil, bad("header length %d exceeds %d", hlen, maxHeaderBytes)
	}
	if len(b) < fileHeaderLen+hlen {
		return nil, bad("truncated: %d bytes, the header alone needs %d", len(b), fileHeaderLen+hlen)
	}
	h := &lodestonepb.SavedSnapshotHeader{}
	if err := proto.Unmarshal(b[fileHeaderLen:fileHeaderLen+hlen], h); err != nil {
		return nil, &DamagedError{Path: path, Reason: "undecodable header", Err: err}
	}
	want := uint64(fileHeaderLen+hlen) + h.GetSize() + sha256.Size
	switch {
	case uint64(len(b)) < want:
		return nil, bad("truncated: %d bytes, the header promises %d (%d bytes of state and a 32-byte checksum)", len(b), want, h.GetSize())
	case uint64(len(b)) > want:
		return nil, bad("%d unexpected bytes after the checksum", uint64(len(b))-want)
	}
	body := b[:len(b)-sha256.Size]
	got := sha256.Sum256(body)
	var stored [32]byte
	copy(stored[:], b[len(b)-sha256.Size:])
	if got != stored {
		return nil, bad("checksum mismatch: stored %s, contents hash to %s", hex.EncodeToString(stored[:8]), hex.EncodeToString(got[:8]))
	}
	return &parsed{header: h, data: body[fileHeaderLen+hlen:], sum: stored, size: int64(len(b))}, nil
}

// loadStore decodes the state of a verified file into a new store and
// checks that it is the state the header describes.
func loadStore(path string, p *parsed) (*store.Store, error) {
	st := store.New()
	if err := st.Restore(bytes.NewReader(p.data)); err != nil {
		return nil, &DamagedError{Path: path, Reason: "state does not decode", Err: err}
	}
	if st.Index() != p.header.GetIndex() {
		return nil, &DamagedError{Path: path, Reason: fmt.Sprintf("state is at index %d, the header says %d", st.Index(), p.header.GetIndex())}
	}
	return st, nil
}

// Inspect verifies the file at path and describes it. A damaged file is
// an error wrapping ErrDamaged that says what is wrong.
func Inspect(path string) (Info, error) {
	p, err := readFile(path)
	if err != nil {
		return Info{}, err
	}
	st, err := loadStore(path, p)
	if err != nil {
		return Info{}, err
	}
	return describe(path, p, st), nil
}

func describe(path string, p *parsed, st *store.Store) Info {
	h := p.header
	in := Info{
		Path: path, Index: h.GetIndex(), Term: h.GetTerm(), Source: h.GetMember(),
		Keys: st.Len(), FileBytes: p.size, DataBytes: h.GetSize(), SHA256: hex.EncodeToString(p.sum[:]),
	}
	roles := map[uint64]string{}
	for _, id := range h.GetVoters() {
		roles[id] = "voter"
	}
	for _, id := range h.GetLearners() {
		roles[id] = "learner"
	}
	for _, m := range st.Members() {
		role, ok := roles[m.GetId()]
		if !ok {
			role = "-"
		}
		in.Members = append(in.Members, Member{ID: fmt.Sprintf("%x", m.GetId()), Name: m.GetName(), PeerAddr: m.GetPeerAddr(), Role: role})
	}
	nodes, _ := st.Nodes()
	in.Nodes = len(nodes)
	for _, n := range nodes {
		if ns, _ := st.Node(n.GetName()); ns != nil {
			in.Services += len(ns.GetServices())
		}
	}
	names, _ := st.Services()
	in.ServiceNames = len(names)
	sessions, _ := st.Sessions()
	in.Sessions = len(sessions)
	return in
}

// writeFileAtomic creates path with the bytes fill writes: a temporary
// file in the same directory, fsync, rename over path, fsync the
// directory. On any error nothing is left behind and path is untouched.
func writeFileAtomic(path string, fill func(w io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("create temporary file: %w", err)
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if err := fill(tmp); err != nil {
		return err
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("fsync %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename into place: %w", err)
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open directory %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync directory %s: %w", dir, err)
	}
	return nil
}
