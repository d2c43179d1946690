package server

import (
	"fmt"

	"go.etcd.io/raft/v3"

	"github.com/lodestone-kv/lodestone/internal/clusterid"
	"github.com/lodestone-kv/lodestone/raftlog"
)

// The cluster id (peer/doc.go has the design): how a server settles its
// own at startup, and learns it when it joined.

// settleCluster decides this member's cluster id once the Raft node has
// restored the data dir's snapshot, and gives it to the store and the
// transport. In order:
//
//   - DATA_DIR/cluster-id exists: that is the id. A damaged file, or a
//     snapshot in the data dir that names another cluster, stops the
//     server: it must not guess which cluster its data belongs to.
//   - The data dir's snapshot names a cluster: that one, saved to the file.
//   - A joining member (Join): none yet; it learns the id from the first
//     member of its cluster that talks to it (peer/identity.go).
//   - Otherwise the member founds a cluster (or its data predates cluster
//     ids): the id derived from ClusterToken and the founding
//     InitialCluster, so every founding member gets the same one without
//     asking the others; a one-member cluster without a token gets a
//     random one. Saved to the file before the bootstrap entries are
//     written.
func (s *Server) settleCluster(fresh bool, founding map[string]string) error {
	dir := s.cfg.DataDir
	fromFile, have, err := clusterid.Load(dir)
	if err != nil {
		return fmt.Errorf("cluster id: %w", err)
	}
	fromSnap := s.store.ClusterID()
	var id clusterid.ID
	switch {
	case have && !fromSnap.IsZero() && fromSnap != fromFile:
		return fmt.Errorf("cluster id: %s/%s says cluster %s, but the snapshot in the data dir holds the state of cluster %s; this data dir mixes two clusters",
			dir, clusterid.FileName, fromFile, fromSnap)
	case have:
		id = fromFile
	case !fromSnap.IsZero():
		id = fromSnap
		s.logger.Info("cluster id taken from the data dir's snapshot", "cluster", id.String())
	case s.cfg.Join:
		s.logger.Info("joining a cluster: its id is learned from the first member that reaches this one")
		return nil
	default:
		if len(founding) == 1 && s.cfg.ClusterToken == "" {
			id = clusterid.Random()
		} else {
			id = clusterid.Derive(s.cfg.ClusterToken, founding)
		}
		if !fresh {
			s.logger.Warn("the data dir has no cluster id (written by an older build); taking the one derived from --initial-cluster and --cluster-token",
				"cluster", id.String())
		}
	}
	if !have {
		if err := clusterid.Save(dir, id); err != nil {
			return err
		}
	}
	s.store.SetClusterID(id)
	s.transport.SetCluster(id)
	s.logger.Info("cluster id", "cluster", id.String())
	return nil
}

// learnCluster is how a joining member keeps the id the transport learned:
// on disk first, so a restart keeps it, then in the store so snapshots
// name it.
func (s *Server) learnCluster(id clusterid.ID) error {
	if err := clusterid.Save(s.cfg.DataDir, id); err != nil {
		return err
	}
	s.store.SetClusterID(id)
	return nil
}

// ClusterID is this member's cluster id; zero while a joining member has
// not learned it.
func (s *Server) ClusterID() clusterid.ID { return s.transport.Cluster() }

// logIsEmpty reports whether lg holds nothing: a member about to bootstrap
// or join.
func logIsEmpty(lg *raftlog.Log) (bool, error) {
	snap, err := lg.Snapshot()
	if err != nil {
		return false, fmt.Errorf("read snapshot: %w", err)
	}
	hs, _, err := lg.InitialState()
	if err != nil {
		return false, fmt.Errorf("read initial state: %w", err)
	}
	last, err := lg.LastIndex()
	if err != nil {
		return false, fmt.Errorf("read last index: %w", err)
	}
	return raft.IsEmptyHardState(hs) && last == 0 && raft.IsEmptySnap(snap), nil
}
