package store

import (
	"bytes"
	"errors"
	"runtime"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/clusterid"
)

// FuzzVerifySnapshot: VerifySnapshot, the check a receiver makes before
// anything else sees a snapshot (peer), agrees with Restore on every
// input: it accepts exactly what Restore accepts, at the same index; it
// refuses with a *CorruptSnapshotError wrapping ErrCorruptSnapshot; and a
// small input never costs a large allocation (a damaged length must not
// size a buffer). FuzzRestore covers Restore's own properties.
func FuzzVerifySnapshot(f *testing.F) {
	for _, b := range snapshotSeeds(f) {
		f.Add(b)
		f.Add(b[:len(b)/2])   // truncated
		f.Add(append(b, 0))   // trailing byte
		bad := bytes.Clone(b) // a flipped byte in the body
		bad[len(bad)/2] ^= 0x40
		f.Add(bad)
	}
	// A record header claiming a 4 GiB payload right after a good header.
	huge := bytes.Clone(encode(f, New())[:headerLen+clusterLen])
	f.Add(append(huge, recKV, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0))
	f.Add([]byte("LDSTSNAP"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		var before runtime.MemStats
		small := len(data) <= 4<<10
		if small {
			runtime.ReadMemStats(&before)
		}
		info, verr := VerifySnapshot(bytes.NewReader(data))
		if small {
			var after runtime.MemStats
			runtime.ReadMemStats(&after)
			// NB: the decoder's own 64 KiB read buffer plus what the
			// records themselves need.
			if got, bound := after.TotalAlloc-before.TotalAlloc, uint64(1<<20+256*len(data)); got > bound {
				t.Fatalf("a %d-byte input allocated %d bytes (bound %d)", len(data), got, bound)
			}
		}
		s := New()
		rerr := s.Restore(bytes.NewReader(data))
		switch {
		case verr != nil:
			var ce *CorruptSnapshotError
			if !errors.As(verr, &ce) || !errors.Is(verr, ErrCorruptSnapshot) {
				t.Fatalf("VerifySnapshot: %v (%T), want a *CorruptSnapshotError", verr, verr)
			}
			if rerr == nil {
				t.Fatalf("VerifySnapshot refused what Restore accepts: %v", verr)
			}
		case rerr != nil:
			t.Fatalf("VerifySnapshot accepted what Restore refuses: %v", rerr)
		default:
			if info.Index != s.Index() {
				t.Fatalf("VerifySnapshot says index %d, Restore %d", info.Index, s.Index())
			}
			if info.Cluster != s.ClusterID() {
				t.Fatalf("VerifySnapshot says cluster %s, Restore %s", info.Cluster, s.ClusterID())
			}
		}
	})
}

// snapshotSeeds are real snapshot streams from the encoder: empty, KV and
// members, a catalog with sessions and locks, admission, ACL tables, and
// a version 2 stream.
func snapshotSeeds(f *testing.F) [][]byte {
	var out [][]byte
	s := New()
	s.Apply(1, putCmd("a", "1"))
	s.SetMember(2, &lodestonepb.Member{Id: 1, Name: "n1"})
	out = append(out, encode(f, s), encode(f, New()))
	cs := New()
	for i, c := range []*lodestonepb.Command{
		regSvc("n1", "web-1", "web"), regCheck("n1", "c1", "web-1", PASSING), sessCreate(sid(1), "n1", withChecks("c1")),
		acquireCmd("k", "v", sid(1)), putCmd("gone", "x"), delCmd("gone"),
	} {
		cs.Apply(uint64(i+1), at(t0, c))
	}
	cs.Apply(cs.Index()+1, admissionCmd(policy(3, true)))
	out = append(out, encode(f, cs))
	cs.SetClusterID(clusterid.ID{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16})
	cs.Apply(cs.Index()+1, bootstrapCmd("acc", "sec"))
	cs.Apply(cs.Index()+1, policySet(true, "p1", "p1", `key_prefix "" { policy = "read" }`))
	cs.Apply(cs.Index()+1, roleSet(true, "r1", "r1", byID("p1")))
	out = append(out, encode(f, cs))
	enc, _ := proto.Marshal(policy(3, true))
	out = append(out, newRaw(2).keyAt("_a", nil, 1, 1).keyAt(legacyAdmissionKey, enc, 2, 2).trailerOld(2, 3, 2, 0, 2).bytes())
	return out
}
