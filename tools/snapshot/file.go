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
	"encoding/hex"
	"errors"
	"fmt"
	"os"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/snapfile"
	"github.com/lodestone-kv/lodestone/store"
)

// The file layout is package snapfile's (internal/snapfile), shared with
// the Consul API's /v1/snapshot; these names keep this package's tests and
// code short.
const (
	fileMagic      = snapfile.Magic
	fileHeaderLen  = snapfile.HeaderLen
	maxHeaderBytes = snapfile.MaxHeaderBytes
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
	return snapfile.EncodeHeader(h)
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
	f, err := snapfile.Parse(b)
	var d *snapfile.Damage
	if errors.As(err, &d) {
		return nil, &DamagedError{Path: path, Reason: d.Reason, Err: d.Err}
	}
	if err != nil {
		return nil, err
	}
	return &parsed{header: f.Header, data: f.Data, sum: f.Sum, size: f.Size}, nil
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
