package store

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/clusterid"
)

func restoreCmd(state []byte) *lodestonepb.Command {
	return &lodestonepb.Command{Op: &lodestonepb.Command_Restore{Restore: &lodestonepb.StateRestore{State: state}}}
}

func snapshotBytes(t *testing.T, s *Store) []byte {
	t.Helper()
	var buf bytes.Buffer
	sn := s.Snapshot()
	defer sn.Close()
	if _, err := sn.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A restore puts back the state a snapshot of this cluster holds: what was
// written after it is gone, what was deleted is back, the membership
// stays, every table index moves to the restore's, and a TTL session's
// clock starts again at the restore.
func TestRestoreReplacesTheState(t *testing.T) {
	c := newClock(t)
	c.s.SetClusterID(clusterid.Random())
	c.ok(
		putCmd("keep", "v1"),
		putCmd("gone-later", "x"),
		regSvc("n1", "web-1", "web"),
		sessCreate(sid(1), "n1", withTTL(10*time.Second)),
	)
	c.s.SetMember(c.s.Index()+1, &lodestonepb.Member{Id: 7, Name: "m7", PeerAddr: "127.0.0.1:1"})
	snap := snapshotBytes(t, c.s)
	c.ok(putCmd("keep", "v2"), putCmd("new", "y"), delCmd("gone-later"), regSvc("n2", "db-1", "db"), dereg("n1", "", ""))
	c.s.SetMember(c.s.Index()+1, &lodestonepb.Member{Id: 8, Name: "m8", PeerAddr: "127.0.0.1:2"})
	c.advance(time.Minute)

	res, evs := c.do(restoreCmd(snap))
	if res.GetRestore() == nil || res.Rejected != nil || len(evs) != 0 {
		t.Fatalf("restore: %v, events %v", res, evKeys(evs))
	}
	idx := c.s.Index()
	for key, want := range map[string]string{"keep": "v1", "gone-later": "x", "new": ""} {
		kv, _ := c.s.Get([]byte(key))
		if got := string(kv.GetValue()); got != want || (want == "" && kv != nil) {
			t.Errorf("key %q after restore: %v, want %q", key, kv, want)
		}
	}
	if ns, _ := c.s.Node("n2"); ns != nil {
		t.Errorf("n2, registered after the snapshot, survived the restore")
	}
	if hs, _ := c.s.HealthService("web", nil, false); len(hs) != 1 {
		t.Errorf("web after restore: %v", hs)
	}
	if len(c.s.Members()) != 2 {
		t.Errorf("members after restore: %v, want the current two", c.s.Members())
	}
	if c.s.KVIndex() != idx || c.s.ServicesIndex() != idx || c.s.NodesIndex() != idx || c.s.ServiceIndex("web") != idx {
		t.Errorf("indices after restore: kv %d services %d nodes %d web %d, want %d",
			c.s.KVIndex(), c.s.ServicesIndex(), c.s.NodesIndex(), c.s.ServiceIndex("web"), idx)
	}
	se, _ := c.s.Session(sid(1))
	if se == nil || se.RenewedUnixNano != c.now {
		t.Fatalf("TTL session after restore: %v, want renewed at the restore's time", se)
	}
}

// Refused restores change nothing and say why.
func TestRestoreRefusals(t *testing.T) {
	c := newClock(t)
	self := clusterid.Random()
	c.s.SetClusterID(self)
	c.ok(putCmd("k", "v1"))

	other := newClock(t)
	other.s.SetClusterID(clusterid.Random())
	other.ok(putCmd("k", "theirs"))
	foreign := snapshotBytes(t, other.s)

	unnamed := newClock(t)
	unnamed.ok(putCmd("k", "unnamed"))
	noCluster := snapshotBytes(t, unnamed.s)

	ahead := newClock(t)
	ahead.s.SetClusterID(self)
	for range 5 {
		ahead.ok(putCmd("k", "future"))
	}
	future := snapshotBytes(t, ahead.s)

	good := snapshotBytes(t, c.s)
	damaged := append([]byte(nil), good...)
	damaged[len(damaged)/2] ^= 0xff

	for _, tc := range []struct {
		name  string
		state []byte
		want  string
	}{
		{"another cluster", foreign, "restores online only into the cluster it was saved from"},
		{"no cluster", noCluster, "names no cluster"},
		{"from the future", future, "at or past this cluster's"},
		{"damaged", damaged, "does not decode"},
	} {
		before := dumpAll(c.s)
		res, _ := c.do(restoreCmd(tc.state))
		if res.Rejected == nil || res.Rejected.Rule != RejectRestore || !strings.Contains(res.Rejected.Detail, tc.want) {
			t.Errorf("%s: %v, want a refusal mentioning %q", tc.name, res, tc.want)
		}
		if after := dumpAll(c.s); after != before {
			t.Errorf("%s: a refused restore changed the state", tc.name)
		}
	}
	if err := CheckCommand(restoreCmd(nil)); err == nil {
		t.Error("a restore without state passed CheckCommand")
	}
}
