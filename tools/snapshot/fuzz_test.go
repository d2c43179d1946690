package snapshot

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
)

// FuzzInspect: Inspect never panics on a snapshot file's bytes. A file it
// refuses yields a *DamagedError wrapping ErrDamaged and naming the file;
// a file it accepts is described consistently with its bytes (sizes,
// checksum, the header's index), and written again from what was read
// (header and state) it is accepted with the same description. With fix
// set the test appends the file's correct SHA-256 first, so the fuzzer
// reaches the header and state decoders behind the checksum.
func FuzzInspect(f *testing.F) {
	for _, body := range inspectSeeds(f) {
		f.Add(withSum(body), false)
		f.Add(body, true)
		f.Add(withSum(body)[:len(body)], false) // the checksum cut off
		bad := withSum(body)
		bad[len(bad)/2] ^= 1
		f.Add(bad, false)
		f.Add(append(withSum(body), 0), false)
	}
	f.Add([]byte{}, false)
	f.Add([]byte(fileMagic), true)
	big := []byte(fileMagic + "\x00\x00\x00\x01\xff\xff\xff\xff") // header length past the limit
	f.Add(big, true)
	dir := f.TempDir()
	for _, body := range inspectSeeds(f) { // NB: the seeds are real files
		path := filepath.Join(dir, "seed.snap")
		if err := os.WriteFile(path, withSum(body), 0o600); err != nil {
			f.Fatal(err)
		}
		if _, err := Inspect(path); err != nil {
			f.Fatalf("seed refused: %v", err)
		}
	}
	f.Fuzz(func(t *testing.T, b []byte, fix bool) {
		if fix {
			b = withSum(b)
		}
		path := filepath.Join(dir, "in.snap")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		in, err := Inspect(path)
		if err != nil {
			var de *DamagedError
			if !errors.As(err, &de) || !errors.Is(err, ErrDamaged) || de.Path != path {
				t.Fatalf("Inspect: %v (%T), want a *DamagedError naming %s", err, err, path)
			}
			return
		}
		sum := sha256.Sum256(b[:len(b)-sha256.Size])
		if in.FileBytes != int64(len(b)) || in.SHA256 != hex.EncodeToString(sum[:]) || in.Path != path {
			t.Fatalf("described as %+v; file is %d bytes, sha256 %x", in, len(b), sum)
		}
		hlen := binary.BigEndian.Uint32(b[12:])
		if got, want := in.DataBytes, uint64(len(b))-fileHeaderLen-uint64(hlen)-sha256.Size; got != want {
			t.Fatalf("data bytes %d, the layout says %d", got, want)
		}
		// Written again from what was read, the file says the same.
		p, err := readFile(path)
		if err != nil {
			t.Fatalf("readFile after Inspect accepted: %v", err)
		}
		st, err := loadStore(path, p)
		if err != nil {
			t.Fatalf("loadStore after Inspect accepted: %v", err)
		}
		var data bytes.Buffer
		if _, err := st.Snapshot().WriteTo(&data); err != nil {
			t.Fatal(err)
		}
		h := cloneHeader(p.header)
		h.Size = uint64(data.Len())
		again := filepath.Join(dir, "again.snap")
		if err := os.WriteFile(again, withSum(fileBytes(t, h, data.Bytes())), 0o600); err != nil {
			t.Fatal(err)
		}
		in2, err := Inspect(again)
		if err != nil {
			t.Fatalf("re-written file refused: %v", err)
		}
		in.Path, in2.Path = "", ""
		in.FileBytes, in2.FileBytes, in.DataBytes, in2.DataBytes, in.SHA256, in2.SHA256 = 0, 0, 0, 0, "", ""
		if !sameInfo(in, in2) {
			t.Fatalf("round trip: %+v, want %+v", in2, in)
		}
	})
}

// inspectSeeds are real snapshot files without their checksum: the
// header from encodeHeader and the state from store's encoder.
func inspectSeeds(f *testing.F) [][]byte {
	var out [][]byte
	for _, st := range []*store.Store{store.New(), seedStore(f)} {
		var data bytes.Buffer
		if _, err := st.Snapshot().WriteTo(&data); err != nil {
			f.Fatal(err)
		}
		h := &lodestonepb.SavedSnapshotHeader{Index: st.Index(), Term: 2, Voters: []uint64{1, 2}, Learners: []uint64{3},
			Size: uint64(data.Len()), Member: "a1"}
		out = append(out, fileBytes(f, h, data.Bytes()))
	}
	return out
}

func seedStore(f *testing.F) *store.Store {
	st := store.New()
	st.Apply(1, &lodestonepb.Command{Op: &lodestonepb.Command_Put{Put: &lodestonepb.PutRequest{Key: []byte("k/a"), Value: []byte("1")}}})
	st.Apply(2, &lodestonepb.Command{Op: &lodestonepb.Command_Put{Put: &lodestonepb.PutRequest{Key: []byte("k/b"), Value: []byte("2")}}})
	st.SetMember(3, &lodestonepb.Member{Id: 1, Name: "a1", PeerAddr: "127.0.0.1:7401"})
	st.SetMember(4, &lodestonepb.Member{Id: 3, Name: "a3", PeerAddr: "127.0.0.1:7403", Learner: true})
	if st.Index() != 4 || st.Len() != 2 {
		f.Fatalf("seed store at %d with %d keys", st.Index(), st.Len())
	}
	return st
}

func fileBytes(t testing.TB, h *lodestonepb.SavedSnapshotHeader, data []byte) []byte {
	hb, err := encodeHeader(h)
	if err != nil {
		t.Fatal(err)
	}
	return append(hb, data...)
}

func withSum(body []byte) []byte {
	sum := sha256.Sum256(body)
	return append(bytes.Clone(body), sum[:]...)
}

func cloneHeader(h *lodestonepb.SavedSnapshotHeader) *lodestonepb.SavedSnapshotHeader {
	return &lodestonepb.SavedSnapshotHeader{Index: h.GetIndex(), Term: h.GetTerm(), Voters: h.GetVoters(),
		Learners: h.GetLearners(), Size: h.GetSize(), Member: h.GetMember()}
}

func sameInfo(a, b Info) bool {
	if len(a.Members) != len(b.Members) {
		return false
	}
	for i := range a.Members {
		if a.Members[i] != b.Members[i] {
			return false
		}
	}
	a.Members, b.Members = nil, nil
	return a.Path == b.Path && a.Index == b.Index && a.Term == b.Term && a.Source == b.Source && a.Keys == b.Keys &&
		a.Nodes == b.Nodes && a.Services == b.Services && a.ServiceNames == b.ServiceNames && a.Sessions == b.Sessions
}
