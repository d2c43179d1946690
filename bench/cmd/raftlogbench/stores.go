package main

import (
	"fmt"
	"os"
	"path/filepath"

	boltv1 "github.com/boltdb/bolt"
	"github.com/hashicorp/raft"
	raftboltdb "github.com/hashicorp/raft-boltdb"
	raftboltdbv2 "github.com/hashicorp/raft-boltdb/v2"
	wal "github.com/hashicorp/raft-wal"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/raftlog"
)

// store is one Raft log implementation, driven the way its Raft library
// drives it: one call per append, durable (fsynced) when it returns.
type store interface {
	// append stores entries [first, first+n) with data, in one durable call.
	append(first uint64, n int, data []byte) error
	// truncateHead discards every entry up to and including upTo, the way
	// the store's Raft library does after a snapshot.
	truncateHead(upTo uint64) error
	// settle waits for work the store does in the background after an
	// append returned (Lodestone's checkpoint into raft.db), so that it
	// does not land inside the next store's timed append.
	settle() error
	close() error
}

// storeKind names an implementation and opens it in a directory.
type storeKind struct {
	name string
	// about says which version and settings run, for the output.
	about string
	open  func(dir string) (store, error)
	// freePages reports the free pages of a closed store's file; ok is false
	// when the store has no freelist (raft-wal).
	freePages func(dir string) (n int, ok bool, err error)
}

const (
	nameLodestone = "lodestone"
	nameBoltV1    = "raft-boltdb"
	nameBoltV2    = "raft-boltdb-v2"
	nameWAL       = "raft-wal"
)

var storeKinds = []storeKind{
	{
		name:  nameLodestone,
		about: "lodestone raftlog (bbolt v1.5.0, hashmap freelist, NoFreelistSync; automatic rotation off unless stated)",
		open: func(dir string) (store, error) {
			l, err := raftlog.Open(dir, raftlog.Options{RotateFreeRatio: -1})
			if err != nil {
				return nil, err
			}
			return &lodestoneStore{l: l}, nil
		},
		freePages: func(dir string) (int, bool, error) {
			in, err := raftlog.Inspect(dir, 0)
			return in.FreePages, true, err
		},
	},
	{
		name:  nameBoltV1,
		about: "hashicorp/raft-boltdb v0.0.0-20230125174641-2a8082862702 (boltdb/bolt v1.3.1: array freelist, written on every commit)",
		open: func(dir string) (store, error) {
			s, err := raftboltdb.NewBoltStore(filepath.Join(dir, "raft.db"))
			if err != nil {
				return nil, err
			}
			return &hashicorpStore{s: s, closeFn: s.Close}, nil
		},
		freePages: func(dir string) (int, bool, error) {
			db, err := boltv1.Open(filepath.Join(dir, "raft.db"), 0o600, &boltv1.Options{ReadOnly: true})
			if err != nil {
				return 0, true, err
			}
			defer db.Close()
			// NB: boltdb/bolt loads the freelist page on Open and counts it
			// in Stats only after a write; count it from a read tx instead.
			var n int
			err = db.View(func(tx *boltv1.Tx) error {
				for id := 2; id < int(tx.Size()/int64(db.Info().PageSize)); {
					p, err := tx.Page(id)
					if err != nil || p == nil {
						return err
					}
					if p.Type == "free" {
						n++ // a free page's header is stale: step one page
						id++
						continue
					}
					id += 1 + p.OverflowCount
				}
				return nil
			})
			return n, true, err
		},
	},
	{
		name:  nameBoltV2,
		about: "hashicorp/raft-boltdb/v2 v2.3.1, default options (go.etcd.io/bbolt v1.5.0 defaults: array freelist, written on every commit)",
		open: func(dir string) (store, error) {
			s, err := raftboltdbv2.New(raftboltdbv2.Options{Path: filepath.Join(dir, "raft.db")})
			if err != nil {
				return nil, err
			}
			return &hashicorpStore{s: s, closeFn: s.Close}, nil
		},
		freePages: func(dir string) (int, bool, error) {
			s, err := raftboltdbv2.New(raftboltdbv2.Options{Path: filepath.Join(dir, "raft.db")})
			if err != nil {
				return 0, true, err
			}
			st := s.Stats()
			return st.FreePageN + st.PendingPageN, true, s.Close()
		},
	},
	{
		name:  nameWAL,
		about: "hashicorp/raft-wal v0.4.2, default options (64 MiB segments)",
		open: func(dir string) (store, error) {
			w, err := wal.Open(dir)
			if err != nil {
				return nil, err
			}
			return &hashicorpStore{s: w, closeFn: w.Close}, nil
		},
		freePages: func(string) (int, bool, error) { return 0, false, nil },
	},
}

func kindByName(name string) (storeKind, error) {
	for _, k := range storeKinds {
		if k.name == name {
			return k, nil
		}
	}
	return storeKind{}, fmt.Errorf("unknown store %q", name)
}

// lodestoneStore drives raftlog as the server does: Save(hard state,
// entries) per Ready; a snapshot record and Compact for truncation.
type lodestoneStore struct {
	l *raftlog.Log
}

var benchConfState = raftpb.ConfState{Voters: []uint64{1}}

func (s *lodestoneStore) append(first uint64, n int, data []byte) error {
	ents := make([]raftpb.Entry, n)
	for k := range ents {
		ents[k] = raftpb.Entry{Index: first + uint64(k), Term: 1, Type: raftpb.EntryNormal, Data: data}
	}
	last := first + uint64(n) - 1
	return s.l.Save(raftpb.HardState{Term: 1, Vote: 1, Commit: last}, ents)
}

func (s *lodestoneStore) truncateHead(upTo uint64) error {
	if _, err := s.l.CreateSnapshot(upTo, &benchConfState, nil); err != nil {
		return fmt.Errorf("snapshot at %d: %w", upTo, err)
	}
	return s.l.Compact(upTo)
}

func (s *lodestoneStore) settle() error { return s.l.WaitCheckpoint() }

func (s *lodestoneStore) close() error { return s.l.Close() }

// logStore is the part of raft.LogStore the benchmark uses.
type logStore interface {
	StoreLogs(logs []*raft.Log) error
	DeleteRange(min, max uint64) error
	FirstIndex() (uint64, error)
}

// hashicorpStore drives a hashicorp/raft LogStore as hashicorp/raft does:
// StoreLogs per batch, DeleteRange after a snapshot.
type hashicorpStore struct {
	s       logStore
	closeFn func() error
}

func (s *hashicorpStore) append(first uint64, n int, data []byte) error {
	logs := make([]*raft.Log, n)
	for k := range logs {
		logs[k] = &raft.Log{Index: first + uint64(k), Term: 1, Type: raft.LogCommand, Data: data}
	}
	return s.s.StoreLogs(logs)
}

func (s *hashicorpStore) truncateHead(upTo uint64) error {
	first, err := s.s.FirstIndex()
	if err != nil {
		return err
	}
	return s.s.DeleteRange(first, upTo)
}

// settle has nothing to wait for: the hashicorp stores do all their work
// inside StoreLogs (raft-wal seals a full segment there too).
func (s *hashicorpStore) settle() error { return nil }

func (s *hashicorpStore) close() error { return s.closeFn() }

// dirBytes is the total size of the regular files under dir.
func dirBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(_ string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
