package store

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

func policy(writes uint64, enabled bool) *lodestonepb.AdmissionPolicy {
	return &lodestonepb.AdmissionPolicy{Enabled: enabled, Reads: 1000, Writes: writes, Watches: 10, RampPercentPerMin: 5, SetUnixNano: t0}
}

// wantAdmission fails unless s holds policy want set at index.
func wantAdmission(t *testing.T, s *Store, want *lodestonepb.AdmissionPolicy, index uint64) {
	t.Helper()
	got, gi := s.Admission()
	if gi != index || (got == nil) != (want == nil) || !proto.Equal(got, want) {
		t.Errorf("Admission() = %s at %d, want %s at %d", fmtPolicy(got), gi, fmtPolicy(want), index)
	}
}

func TestApplyAdmission(t *testing.T) {
	d := newDriver(t)
	wantAdmission(t, d.s, nil, 0)
	d.apply(putCmd("a", "1"))

	p := policy(100, true)
	cmd := admissionCmd(p)
	res, evs := d.apply(cmd)
	if res == nil || res.Result != nil || res.Rejected != nil || CheckCommand(cmd) != nil {
		t.Fatalf("admission result %v (CheckCommand %v), want an empty result for a well-formed command", res, CheckCommand(cmd))
	}
	if len(evs) != 0 {
		t.Errorf("admission emitted events %v, want none (the policy is not a key)", fmtEvents(evs))
	}
	wantAdmission(t, d.s, policy(100, true), 2)
	if got, want := d.s.Index(), uint64(2); got != want {
		t.Errorf("Index = %d, want %d", got, want)
	}
	if got, want := d.s.KVIndex(), uint64(1); got != want {
		t.Errorf("KVIndex = %d, want %d: an admission command changes no key", got, want)
	}
	if kv, _ := d.s.Get([]byte(legacyAdmissionKey)); kv != nil {
		t.Errorf("policy stored as key %s", fmtKV(kv))
	}
	p.Writes = 7 // Apply must not retain the command's message
	wantAdmission(t, d.s, policy(100, true), 2)

	// A disabled policy replaces it: that is how an operator turns
	// admission control off.
	d.apply(admissionCmd(policy(0, false)))
	wantAdmission(t, d.s, policy(0, false), 3)

	// A replay changes nothing.
	if res, evs := d.s.Apply(2, admissionCmd(policy(5, true))); res != nil || evs != nil {
		t.Errorf("replay returned %v %v, want nil nil", res, evs)
	}
	wantAdmission(t, d.s, policy(0, false), 3)

	// A command without its policy is malformed: only the index moves.
	bad := admissionCmd(nil)
	if err := CheckCommand(bad); !errors.Is(err, ErrInvalid) {
		t.Errorf("CheckCommand(admission without policy) = %v, want ErrInvalid", err)
	}
	d.apply(bad)
	wantAdmission(t, d.s, policy(0, false), 3)
	if got, want := d.s.Index(), uint64(4); got != want {
		t.Errorf("Index = %d, want %d", got, want)
	}
}

// TestLegacyAdmissionKeyIsOrdinary: the key older builds kept the policy
// under is a key like any other; no KV command changes the policy.
func TestLegacyAdmissionKeyIsOrdinary(t *testing.T) {
	d := newDriver(t)
	d.apply(admissionCmd(policy(100, true)))
	for _, cmd := range []*lodestonepb.Command{
		putCmd(legacyAdmissionKey, "garbage that does not decode \xff\xff"),
		putCmd(legacyAdmissionKey, ""),
		delCmd(legacyAdmissionKey),
		putCmd(legacyAdmissionKey, "x"),
		delPrefix("_lodestone/"),
		txnCmd(opSet(legacyAdmissionKey, "y"), op(DELETE, legacyAdmissionKey), opSet(legacyAdmissionKey, "z")),
	} {
		res, evs := d.apply(cmd)
		if res.Result == nil {
			t.Fatalf("%v: malformed", cmd)
		}
		for _, e := range evs {
			if string(e.KV.Key) != legacyAdmissionKey {
				t.Errorf("%v: event on %q", cmd, e.KV.Key)
			}
		}
		wantAdmission(t, d.s, policy(100, true), 1)
	}
	if kv, _ := d.s.Get([]byte(legacyAdmissionKey)); string(kv.GetValue()) != "z" {
		t.Errorf("key holds %s, want the txn's value", fmtKV(kv))
	}
}

func TestAdmissionSnapshotRoundTrip(t *testing.T) {
	c := catalogStore(t) // every table, so the admission record follows all of them
	c.do(admissionCmd(policy(100, true)))
	c.ok(putCmd(legacyAdmissionKey, "ordinary"))
	b := encode(t, c.s)

	r := New()
	r.Apply(1, admissionCmd(policy(9, false))) // replaced, not kept
	if err := r.Restore(bytes.NewReader(b)); err != nil {
		t.Fatalf("Restore: %v", err)
	}
	checkInvariants(t, r)
	compareStores(t, r, c.s)
	_, idx := c.s.Admission()
	wantAdmission(t, r, policy(100, true), idx)
	if kv, _ := r.Get([]byte(legacyAdmissionKey)); string(kv.GetValue()) != "ordinary" {
		t.Errorf("a version 3 snapshot must restore %q as an ordinary key, got %s", legacyAdmissionKey, fmtKV(kv))
	}
	if got := encode(t, r); !bytes.Equal(got, b) {
		t.Errorf("re-encoding a restored store gives different bytes")
	}

	// A snapshot without a policy restores none.
	if err := r.Restore(bytes.NewReader(encode(t, New()))); err != nil {
		t.Fatal(err)
	}
	wantAdmission(t, r, nil, 0)

	// A snapshot taken before the policy changed keeps the old one.
	d := newDriver(t)
	d.apply(admissionCmd(policy(1, true)))
	sn := d.s.Snapshot()
	d.apply(admissionCmd(policy(2, true)))
	var buf bytes.Buffer
	if _, err := sn.WriteTo(&buf); err != nil {
		t.Fatal(err)
	}
	if err := r.Restore(&buf); err != nil {
		t.Fatal(err)
	}
	wantAdmission(t, r, policy(1, true), 1)
}

// trailerV3 appends a version-3 trailer: index, kv_index, the counts of
// the records written.
func (r *rawSnapshot) trailerV3(index, kvIndex uint64, counts map[byte]uint64) *rawSnapshot {
	var p [trailerLenV3]byte
	binary.BigEndian.PutUint64(p[0:], index)
	binary.BigEndian.PutUint64(p[8:], kvIndex)
	for typ, n := range counts {
		binary.BigEndian.PutUint64(p[56+8*(int(typ)-1):], n)
	}
	binary.BigEndian.PutUint32(p[56+8*recTypesV3:], r.crc)
	return r.record(recTrailer, p[:])
}

// trailerOld appends a version 1 or 2 trailer for members and keys only.
func (r *rawSnapshot) trailerOld(version uint32, index, kvIndex, members, keys uint64) *rawSnapshot {
	p := make([]byte, trailerLenV2)
	countsAt, crcAt := 56, 136
	if version == 1 {
		p, countsAt, crcAt = p[:trailerLen], 24, 40
	}
	binary.BigEndian.PutUint64(p[0:], index)
	binary.BigEndian.PutUint64(p[8:], kvIndex)
	binary.BigEndian.PutUint64(p[countsAt:], members)
	binary.BigEndian.PutUint64(p[countsAt+8:], keys)
	binary.BigEndian.PutUint32(p[crcAt:], r.crc)
	return r.record(recTrailer, p)
}

func (r *rawSnapshot) keyAt(key string, value []byte, create, modify uint64) *rawSnapshot {
	return r.msg(recKV, &lodestonepb.KeyValue{Key: []byte(key), Value: value, CreateIndex: create, ModifyIndex: modify})
}

func (r *rawSnapshot) admission(index uint64, p *lodestonepb.AdmissionPolicy) *rawSnapshot {
	b, _ := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	return r.record(recAdmission, append(binary.BigEndian.AppendUint64(nil, index), b...))
}

// TestRestoreMigratesLegacyAdmission: a snapshot written before version 3
// holds the policy under the key; Restore moves it into the admission
// state, stamped with the key's ModifyIndex, and drops the key.
func TestRestoreMigratesLegacyAdmission(t *testing.T) {
	enc, _ := proto.MarshalOptions{Deterministic: true}.Marshal(policy(100, true))
	tests := []struct {
		name    string
		input   []byte
		want    *lodestonepb.AdmissionPolicy
		wantIdx uint64
		keys    string // what dumpKVs shows after the restore
	}{
		{"version 2 with the key",
			newRaw(2).member(1).keyAt("_a", []byte("x"), 2, 2).keyAt(legacyAdmissionKey, enc, 3, 7).keyAt("z", []byte("y"), 4, 8).
				trailerOld(2, 9, 8, 1, 3).bytes(),
			policy(100, true), 7, "_a=\"x\" c=2 m=2 l=0 f=0 s=\"\"\nz=\"y\" c=4 m=8 l=0 f=0 s=\"\"\n"},
		{"version 1 with the key",
			newRaw(1).keyAt(legacyAdmissionKey, enc, 3, 7).trailerOld(1, 9, 7, 0, 1).bytes(),
			policy(100, true), 7, ""},
		{"version 2, key overwritten with something undecodable",
			newRaw(2).keyAt(legacyAdmissionKey, []byte("\xff\xff"), 3, 7).trailerOld(2, 9, 7, 0, 1).bytes(),
			&lodestonepb.AdmissionPolicy{}, 7, ""},
		{"version 2, key overwritten with an empty value",
			newRaw(2).keyAt(legacyAdmissionKey, nil, 3, 6).trailerOld(2, 9, 7, 0, 1).bytes(),
			&lodestonepb.AdmissionPolicy{}, 6, ""},
		{"version 2 without the key",
			newRaw(2).keyAt("a", []byte("x"), 3, 7).trailerOld(2, 9, 7, 0, 1).bytes(),
			nil, 0, "a=\"x\" c=3 m=7 l=0 f=0 s=\"\"\n"},
		{"version 2, key with ModifyIndex 0",
			newRaw(2).keyAt(legacyAdmissionKey, enc, 0, 0).trailerOld(2, 9, 7, 0, 1).bytes(),
			nil, 0, ""},
		{"version 3: the key is ordinary",
			newRaw(3).keyAt(legacyAdmissionKey, enc, 3, 7).admission(5, policy(1, false)).
				trailerV3(9, 7, map[byte]uint64{recKV: 1, recAdmission: 1}).bytes(),
			policy(1, false), 5, fmt.Sprintf("%s=%q c=3 m=7 l=0 f=0 s=\"\"\n", legacyAdmissionKey, enc)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newDriver(t)
			s.apply(admissionCmd(policy(42, true))) // replaced by whatever the snapshot says
			if err := s.s.Restore(bytes.NewReader(tt.input)); err != nil {
				t.Fatalf("Restore: %v", err)
			}
			checkInvariants(t, s.s)
			wantAdmission(t, s.s, tt.want, tt.wantIdx)
			if got := dumpKVs(s.s); got != tt.keys {
				t.Errorf("keys:\n%s\nwant\n%s", got, tt.keys)
			}
			if got, want := s.s.Index(), uint64(9); got != want {
				t.Errorf("Index = %d, want %d", got, want)
			}
			if got := s.s.KVIndexFor([]byte(legacyAdmissionKey), false); tt.keys == "" && got != 1 {
				t.Errorf("KVIndexFor(%s) = %d, want 1: the migration leaves no tombstone", legacyAdmissionKey, got)
			}
			// The migrated state is written as version 3 and survives its
			// own round trip unchanged.
			b := encode(t, s.s)
			if got := binary.BigEndian.Uint32(b[8:]); got != snapshotVersion {
				t.Errorf("re-encoded as version %d", got)
			}
			again := New()
			if err := again.Restore(bytes.NewReader(b)); err != nil {
				t.Fatalf("restore re-encoded: %v", err)
			}
			compareStores(t, again, s.s)
		})
	}
}

// TestUpgradeReplayAgrees: a replica restoring an old snapshot taken after
// an admission command, and one restoring an old snapshot taken before it
// and then replaying the command with this build, end with the same
// policy and the same keys (SNAPSHOT.md, Migration).
func TestUpgradeReplayAgrees(t *testing.T) {
	p := policy(100, true)
	enc, _ := proto.MarshalOptions{Deterministic: true}.Marshal(p)
	// The old build: key "a" at 3, the admission command at 5 as a put.
	before := newRaw(2).keyAt("a", []byte("v"), 3, 3).trailerOld(2, 4, 3, 0, 1).bytes()
	after := newRaw(2).keyAt("_lodestone/admission", enc, 5, 5).keyAt("a", []byte("v"), 3, 3).trailerOld(2, 5, 5, 0, 2).bytes()
	// NB: "_lodestone/admission" sorts before "a".

	replayed := New()
	if err := replayed.Restore(bytes.NewReader(before)); err != nil {
		t.Fatal(err)
	}
	replayed.Apply(5, admissionCmd(p))
	migrated := New()
	if err := migrated.Restore(bytes.NewReader(after)); err != nil {
		t.Fatal(err)
	}
	wantAdmission(t, replayed, p, 5)
	wantAdmission(t, migrated, p, 5)
	if got, want := dumpKVs(migrated), dumpKVs(replayed); got != want {
		t.Errorf("keys after migration:\n%s\nafter replay:\n%s", got, want)
	}
	// kv_index is the documented difference: the old put moved it.
	if got, want := migrated.KVIndex(), uint64(5); got != want {
		t.Errorf("migrated KVIndex = %d, want %d (kept as read)", got, want)
	}
	if got, want := replayed.KVIndex(), uint64(3); got != want {
		t.Errorf("replayed KVIndex = %d, want %d", got, want)
	}
	// From the next key change on, they agree.
	replayed.Apply(6, putCmd("b", "1"))
	migrated.Apply(6, putCmd("b", "1"))
	compareStores(t, migrated, replayed)
}

func TestRestoreRefusesAdmissionDamage(t *testing.T) {
	p := policy(1, true)
	one := map[byte]uint64{recAdmission: 1}
	tests := []struct {
		name  string
		input []byte
		want  string
	}{
		{"two policies", newRaw(3).admission(1, p).admission(2, p).trailerV3(5, 0, map[byte]uint64{recAdmission: 2}).bytes(),
			"record 1: more than one admission policy"},
		{"short record", newRaw(3).record(recAdmission, []byte{1, 2, 3}).trailerV3(5, 0, one).bytes(),
			"record 0: admission record is 3 bytes, want at least 8"},
		{"index 0", newRaw(3).admission(0, p).trailerV3(5, 0, one).bytes(),
			"record 0: admission policy set at index 0"},
		{"undecodable policy", newRaw(3).record(recAdmission, append(binary.BigEndian.AppendUint64(nil, 1), 0xff, 0xff)).trailerV3(5, 0, one).bytes(),
			"record 0: decode admission policy"},
		{"index above snapshot index", newRaw(3).admission(9, p).trailerV3(5, 0, one).bytes(),
			"indices above snapshot index 5"},
		{"count disagrees", newRaw(3).admission(1, p).trailerV3(5, 0, nil).bytes(),
			"trailer counts 0 admission policies, read 1"},
		{"admission record in version 2", newRaw(2).admission(1, p).bytes(),
			"record 0: unknown type 11"},
		{"version 2 trailer in version 3", newRaw(3).trailerOld(2, 5, 0, 0, 0).bytes(),
			"trailer is 140 bytes, want 148"},
		{"admission before catalog", newRaw(3).admission(1, p).msg(recNode, &lodestonepb.Node{Name: "n1"}).bytes(),
			"record 1: node after admission policies"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := newDriver(t)
			d.apply(admissionCmd(policy(42, true)))
			before := dump(d.s)
			err := d.s.Restore(bytes.NewReader(tt.input))
			var ce *CorruptSnapshotError
			if !errors.As(err, &ce) || !errors.Is(err, ErrCorruptSnapshot) {
				t.Fatalf("Restore = %v, want a *CorruptSnapshotError", err)
			}
			if !strings.Contains(ce.Reason, tt.want) {
				t.Errorf("reason %q, want it to contain %q", ce.Reason, tt.want)
			}
			if got := dump(d.s); got != before {
				t.Errorf("a failed restore changed the store:\n%s\nwant\n%s", got, before)
			}
		})
	}
}

// TestAdmissionDeterminism: two stores applying the same log that sets
// the policy, writes the old key and snapshots agree on the policy, its
// index and the snapshot bytes; only admission commands move it.
func TestAdmissionDeterminism(t *testing.T) {
	seed := testSeed(t)
	steps := randomSteps(seed, 3000)
	a, b := New(), New()
	run(t, a, steps)
	run(t, b, steps)
	pa, ia := a.Admission()
	pb, ib := b.Admission()
	if pa == nil || ia != ib || !proto.Equal(pa, pb) {
		t.Fatalf("policies differ or missing: %d %s vs %d %s", ia, fmtPolicy(pa), ib, fmtPolicy(pb))
	}
	if !bytes.Equal(encode(t, a), encode(t, b)) {
		t.Fatalf("snapshot bytes differ")
	}

	// The same answer two ways: the policy is the last admission command
	// of the log, at its index, whatever else the log did.
	var want *lodestonepb.AdmissionPolicy
	var wantIdx uint64
	for _, st := range steps {
		cmd := &lodestonepb.Command{}
		if st.kind != 'c' || proto.Unmarshal(st.cmd, cmd) != nil || cmd.GetAdmission() == nil || st.index <= wantIdx {
			continue
		}
		want, wantIdx = cmd.GetAdmission(), st.index
	}
	wantAdmission(t, a, want, wantIdx)
}
