package snapshot

import (
	"bytes"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/atomicfile"
	"github.com/lodestone-kv/lodestone/internal/clusterid"
	"github.com/lodestone-kv/lodestone/internal/member"
	"github.com/lodestone-kv/lodestone/raftlog"
)

// RestoreOptions configures Restore.
type RestoreOptions struct {
	// Path is the snapshot file.
	Path string
	// DataDir is the new member's --data-dir; it must be empty or absent.
	DataDir string
	// Name is the new member's --name; it must be in InitialCluster.
	Name string
	// InitialCluster lists every member of the new cluster, name → peer
	// address, exactly as each of them will be started with.
	InitialCluster map[string]string
}

// Restore prepares DataDir so that `lodestone server --name Name
// --data-dir DataDir --initial-cluster ...` starts as a member of a new
// cluster holding the snapshot's state. Every member of the new cluster is
// restored from the same file with the same InitialCluster: they then agree
// on the log up to the snapshot's index and elect a leader.
//
// The snapshot's membership is replaced by InitialCluster, both in the
// state (so members find each other) and in the Raft configuration (all
// voters). The data directory is built beside DataDir and renamed into
// place, so a failed restore leaves nothing behind.
func Restore(o RestoreOptions, out io.Writer) (Info, error) {
	if _, ok := o.InitialCluster[o.Name]; !ok {
		return Info{}, fmt.Errorf("--initial-cluster does not list --name %q", o.Name)
	}
	if err := checkEmptyDir(o.DataDir); err != nil {
		return Info{}, err
	}
	p, err := readFile(o.Path)
	if err != nil {
		return Info{}, err
	}
	st, err := loadStore(o.Path, p)
	if err != nil {
		return Info{}, err
	}
	index, term := p.header.GetIndex(), p.header.GetTerm()
	if index == 0 || term == 0 {
		return Info{}, &DamagedError{Path: o.Path, Reason: fmt.Sprintf("index %d, term %d: a snapshot of a running cluster has both above 0", index, term)}
	}
	for _, m := range st.Members() {
		st.RemoveMember(index, m.GetId())
	}
	names := make([]string, 0, len(o.InitialCluster))
	for name := range o.InitialCluster {
		names = append(names, name)
	}
	sort.Strings(names)
	var voters []uint64
	for _, name := range names {
		id := member.ID(name)
		voters = append(voters, id)
		st.SetMember(index, &lodestonepb.Member{Id: id, Name: name, PeerAddr: o.InitialCluster[name]})
	}
	// The restored cluster keeps the snapshot's cluster id: every member
	// restored from this file gets the same one with nothing more to say,
	// and a snapshot from the cluster it replaces still fits it. A file
	// from before cluster ids gets one derived from its checksum and the
	// new members, the same on every member restored from it.
	cluster := st.ClusterID()
	if cluster.IsZero() {
		cluster = clusterid.Derive("restored from snapshot "+hex.EncodeToString(p.sum[:]), o.InitialCluster)
		st.SetClusterID(cluster)
	}
	var buf bytes.Buffer
	sn := st.Snapshot()
	_, err = sn.WriteTo(&buf)
	sn.Close()
	if err != nil {
		return Info{}, fmt.Errorf("encode restored state: %w", err)
	}

	if err := os.MkdirAll(o.DataDir, 0o755); err != nil {
		return Info{}, fmt.Errorf("create data dir: %w", err)
	}
	final := filepath.Join(o.DataDir, "raft")
	staging := final + ".restoring"
	if err := os.RemoveAll(staging); err != nil {
		return Info{}, fmt.Errorf("remove leftover %s: %w", staging, err)
	}
	err = func() (err error) {
		lg, err := raftlog.Open(staging, raftlog.Options{RotateFreeRatio: -1})
		if err != nil {
			return fmt.Errorf("create raft log: %w", err)
		}
		defer func() {
			if cerr := lg.Close(); cerr != nil && err == nil {
				err = fmt.Errorf("close raft log: %w", cerr)
			}
		}()
		snap := raftpb.Snapshot{Data: buf.Bytes(), Metadata: raftpb.SnapshotMetadata{
			Index: index, Term: term, ConfState: raftpb.ConfState{Voters: voters},
		}}
		if err := lg.ApplySnapshot(snap); err != nil {
			return fmt.Errorf("write snapshot: %w", err)
		}
		// NB: the term must be the snapshot's: a leader elected at a lower
		// term would append entries with a term below the log's last.
		if err := lg.Save(raftpb.HardState{Term: term, Commit: index}, nil); err != nil {
			return fmt.Errorf("write hard state: %w", err)
		}
		return nil
	}()
	if err == nil {
		if err = os.Rename(staging, final); err == nil {
			err = atomicfile.SyncDir(o.DataDir)
		}
	}
	if err == nil {
		// NB: after the log: a restore cut before this still starts, as
		// the server takes the id the snapshot names.
		if err = clusterid.Save(o.DataDir, cluster); err != nil {
			os.RemoveAll(final)
		}
	}
	if err != nil {
		os.RemoveAll(staging)
		return Info{}, err
	}
	in := describe(o.Path, p, st)
	fmt.Fprintf(out, "restored %s into %s: index %d, term %d, %d keys, %d services; member %s of a new cluster of %d (%s), cluster id %s\n",
		o.Path, o.DataDir, index, term, in.Keys, in.Services, o.Name, len(names), member.FormatCluster(o.InitialCluster), cluster)
	return in, nil
}

// checkEmptyDir refuses a data dir that holds anything: restoring over a
// node's data would mix two clusters' logs.
func checkEmptyDir(dir string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read --data-dir: %w", err)
	}
	if len(ents) > 0 {
		return fmt.Errorf("--data-dir %s is not empty (it holds %s); restore into a new, empty directory", dir, ents[0].Name())
	}
	return nil
}
