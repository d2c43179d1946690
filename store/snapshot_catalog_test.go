package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// catalogStore builds a store using every table: nodes, services, checks,
// sessions holding locks, tombstones, lock delays, per-name indices.
func catalogStore(t *testing.T) *clock {
	c := newClock(t)
	c.ok(regSvc("n1", "web-1", "web", "v1"), regCheck("n1", "http", "web-1", PASSING), regCheck("n1", "serfHealth", "", PASSING),
		regSvc("n2", "db-1", "db"), sessCreate(sid(1), "n1", withChecks("serfHealth")), sessCreate(sid(2), "n2", withDelete()),
		acquireCmd("lock/a", "1", sid(1)), acquireCmd("lock/b", "2", sid(2)), putCmd("gone", "x"), delCmd("gone"),
		sessDestroy(sid(2)))
	c.s.SetMember(c.s.Index(), &lodestonepb.Member{Id: 3, Name: "m3"})
	return c
}

func TestSnapshotCatalogRoundTrip(t *testing.T) {
	c := catalogStore(t)
	b := encode(t, c.s)
	r := New()
	if err := r.Restore(bytes.NewReader(b)); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	checkInvariants(t, r)
	compareStores(t, r, c.s)
	if _, ok := r.LockDelay([]byte("lock/b")); !ok {
		t.Errorf("lock delay lost")
	}
	if got := r.KVIndexFor([]byte("gone"), false); got != 10 {
		t.Errorf("tombstone lost: KVIndexFor(gone) = %d, want 10", got)
	}
	// The restored store behaves the same from here on: the lock is held,
	// the delay is in force, the session's check still binds it.
	for _, cmd := range []*lodestonepb.Command{
		sessCreate(sid(3), "n2"), acquireCmd("lock/a", "x", sid(3)), acquireCmd("lock/b", "x", sid(3)),
		checkUpd("n1", "serfHealth", CRITICAL, "down"), acquireCmd("lock/a", "x", sid(3)),
	} {
		cmd.TimeUnixNano = c.now
		ra, ea := c.s.Apply(c.s.Index()+1, proto.CloneOf(cmd))
		rb, eb := r.Apply(r.Index()+1, cmd)
		if !proto.Equal(ra, rb) || strings.Join(fmtEvents(ea), ";") != strings.Join(fmtEvents(eb), ";") {
			t.Errorf("%v: restored store answers %v %q, original %v %q", cmd, rb, fmtEvents(eb), ra, fmtEvents(ea))
		}
	}
	compareStores(t, r, c.s)
}

func TestRestoreVersion1(t *testing.T) {
	old := newRaw(1).member(1).kv("a", 3).kv("b", 4).trailer(5, 1, 2).bytes()
	s := newClock(t)
	s.ok(regSvc("n1", "web", "web"))
	if err := s.s.Restore(bytes.NewReader(old)); err != nil {
		t.Fatalf("Restore(v1): %v", err)
	}
	if got, want := dumpKVs(s.s), "a=\"v\" c=3 m=3 l=0 f=0 s=\"\"\nb=\"v\" c=4 m=4 l=0 f=0 s=\"\"\n"; got != want {
		t.Errorf("keys %q, want %q", got, want)
	}
	if nodes, _ := s.s.Nodes(); len(nodes) != 0 || s.s.NodesIndex() != 1 {
		t.Errorf("a v1 snapshot must restore an empty catalog, got %v", nodes)
	}
	checkInvariants(t, s.s)
	// A catalog record in a v1 stream is refused.
	nb, _ := proto.Marshal(&lodestonepb.Node{Name: "n1"})
	err := New().Restore(bytes.NewReader(newRaw(1).record(recNode, nb).trailer(5, 0, 0).bytes()))
	var ce *CorruptSnapshotError
	if !errors.As(err, &ce) || !strings.Contains(ce.Reason, "record 0: unknown type 3") {
		t.Errorf("v1 with a node record: %v", err)
	}
}

// rawV2 appends a version-2 trailer counting the records written.
func (r *rawSnapshot) trailerV2(index uint64, counts map[byte]uint64) *rawSnapshot {
	var p [trailerLenV2]byte
	binary.BigEndian.PutUint64(p[0:], index)
	for typ, n := range counts {
		binary.BigEndian.PutUint64(p[56+8*(int(typ)-1):], n)
	}
	binary.BigEndian.PutUint32(p[136:], r.crc)
	return r.record(recTrailer, p[:])
}

func (r *rawSnapshot) msg(typ byte, m proto.Message) *rawSnapshot {
	b, _ := proto.Marshal(m)
	return r.record(typ, b)
}

func (r *rawSnapshot) indexed(typ byte, v uint64, key string) *rawSnapshot {
	return r.record(typ, append(binary.BigEndian.AppendUint64(nil, v), key...))
}

func TestRestoreRefusesCatalogDamage(t *testing.T) {
	n1 := &lodestonepb.Node{Name: "n1", CreateIndex: 1, ModifyIndex: 1}
	tests := []struct {
		name  string
		input []byte
		want  string
	}{
		{"service on unknown node", newRaw(2).msg(recService, &lodestonepb.Service{Id: "s", Name: "s", Node: "n9"}).trailerV2(5, map[byte]uint64{4: 1}).bytes(),
			`record 0: service "s" on unknown node "n9"`},
		{"check of unknown service", newRaw(2).msg(recNode, n1).msg(recCheck, &lodestonepb.Check{Node: "n1", CheckId: "c", ServiceId: "s"}).trailerV2(5, map[byte]uint64{3: 1, 5: 1}).bytes(),
			`record 1: check "c" of unknown service "s" on node "n1"`},
		{"session bound to unknown check", newRaw(2).msg(recNode, n1).msg(recSession, &lodestonepb.SessionEntry{Id: "x", Node: "n1", NodeChecks: []string{"c"}}).trailerV2(5, map[byte]uint64{3: 1, 6: 1}).bytes(),
			`record 1: session "x" bound to unknown check "c"`},
		{"key held by unknown session", func() []byte {
			b, _ := proto.Marshal(&lodestonepb.KeyValue{Key: []byte("k"), CreateIndex: 1, ModifyIndex: 1, Session: "x"})
			return newRaw(2).record(recKV, b).trailerV2(5, map[byte]uint64{2: 1}).bytes()
		}(), `key "k" held by unknown session "x"`},
		{"types out of order", newRaw(2).msg(recNode, n1).kv("a", 1).trailerV2(5, map[byte]uint64{2: 1, 3: 1}).bytes(),
			"record 1: key after nodes"},
		{"nodes out of order", newRaw(2).msg(recNode, &lodestonepb.Node{Name: "b"}).msg(recNode, &lodestonepb.Node{Name: "a"}).trailerV2(5, map[byte]uint64{3: 2}).bytes(),
			`record 1: node "a" not after "b"`},
		{"short index record", newRaw(2).record(recTombstone, []byte{1, 2}).bytes(), "record 0: tombstone record is 2 bytes, want at least 9"},
		{"tombstone above snapshot index", newRaw(2).indexed(recTombstone, 9, "k").trailerV2(5, map[byte]uint64{7: 1}).bytes(), "indices above snapshot index 5"},
		{"node index of unknown node", newRaw(2).indexed(recNodeIndex, 1, "n9").trailerV2(5, map[byte]uint64{9: 1}).bytes(), `record 0: node index of unknown node "n9"`},
		{"count disagrees", newRaw(2).msg(recNode, n1).trailerV2(5, map[byte]uint64{3: 2}).bytes(), "trailer counts 2 nodes, read 1"},
		{"v1 trailer in v2", newRaw(2).trailer(5, 0, 0).bytes(), "trailer is 44 bytes, want 140"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := catalogStore(t)
			before := dump(c.s) + dumpCatalog(c.s)
			err := c.s.Restore(bytes.NewReader(tt.input))
			var ce *CorruptSnapshotError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorruptSnapshot) {
				t.Fatalf("Restore = %v, want a *CorruptSnapshotError", err)
			}
			if !strings.Contains(ce.Reason, tt.want) {
				t.Errorf("reason %q, want it to contain %q", ce.Reason, tt.want)
			}
			if got := dump(c.s) + dumpCatalog(c.s); got != before {
				t.Errorf("a failed restore changed the store")
			}
		})
	}
}

// TestRestoreRefusesEveryCatalogTruncationAndFlip: no prefix and no single
// damaged byte of a snapshot with every table is accepted.
func TestRestoreRefusesEveryCatalogTruncationAndFlip(t *testing.T) {
	valid := encode(t, catalogStore(t).s)
	for n := 0; n < len(valid); n++ {
		if err := New().Restore(bytes.NewReader(valid[:n])); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("prefix of %d/%d bytes: err = %v, want ErrCorruptSnapshot", n, len(valid), err)
		}
	}
	for i := range valid {
		b := bytes.Clone(valid)
		b[i] ^= 0x5a
		if err := New().Restore(bytes.NewReader(b)); !errors.Is(err, ErrCorruptSnapshot) {
			t.Fatalf("byte %d flipped: err = %v, want ErrCorruptSnapshot", i, err)
		}
	}
}
