package peer

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"testing"

	"go.etcd.io/raft/v3/raftpb"
)

// FuzzRaftStreamFrames: a Raft stream's bytes after the preamble, as
// frameReader.message reads them. Reading never panics; it ends at a clean
// io.EOF between frames or with an error; every message it yields,
// framed again by appendFrame, reads back the same; and a short stream
// never costs a large allocation, whatever length its frames claim (a
// peer that sends four bytes must not make the receiver allocate 64 MiB).
func FuzzRaftStreamFrames(f *testing.F) {
	msgs := []raftpb.Message{
		{Type: raftpb.MsgApp, To: 2, From: 1, Term: 3, Index: 9, LogTerm: 3, Commit: 8,
			Entries: []raftpb.Entry{{Term: 3, Index: 10, Data: []byte("put a=1")}}},
		{Type: raftpb.MsgHeartbeat, To: 2, From: 1, Term: 3, Commit: 11},
		{Type: raftpb.MsgAppResp, To: 1, From: 2, Term: 3, Index: 11, Reject: true, RejectHint: 7},
		{Type: raftpb.MsgSnap, To: 2, From: 1, Term: 3, Snapshot: &raftpb.Snapshot{Metadata: raftpb.SnapshotMetadata{
			Index: 5, Term: 2, ConfState: raftpb.ConfState{Voters: []uint64{1, 2}}}}},
	}
	var stream []byte
	for i := range msgs {
		one, err := appendFrame(nil, &msgs[i])
		if err != nil {
			f.Fatal(err)
		}
		f.Add(one)
		stream = append(stream, one...)
	}
	f.Add(stream)
	f.Add(stream[:len(stream)-3])                            // torn at close
	f.Add([]byte{0, 0, 0, 0})                                // an empty frame
	f.Add(binary.BigEndian.AppendUint32(nil, maxMsgBytes))   // a 64 MiB claim, no payload
	f.Add(binary.BigEndian.AppendUint32(nil, maxMsgBytes+1)) // over the limit
	f.Add(binary.BigEndian.AppendUint32(nil, frameKeep+1))
	f.Add(append(binary.BigEndian.AppendUint32(nil, 3), 0x08, 0xff, 0xff)) // truncated varint
	f.Fuzz(func(t *testing.T, b []byte) {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		fr := newFrameReader(bytes.NewReader(b), 512)
		var got []raftpb.Message
		var err error
		for {
			var m raftpb.Message
			if err = fr.message(&m); err != nil {
				break
			}
			got = append(got, m)
		}
		runtime.ReadMemStats(&after)
		// NB: the reader's first 32 KiB of payload buffer, its growth
		// (twice the bytes read), the messages (a 2-byte empty entry is a
		// 64-byte Entry) and slack for the runtime: linear in the input.
		if used, bound := after.TotalAlloc-before.TotalAlloc, uint64(128<<10+128*len(b)); used > bound {
			t.Fatalf("a %d-byte stream allocated %d bytes (bound %d)", len(b), used, bound)
		}
		if errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && err != io.EOF {
			t.Fatalf("EOF wrapped in %v: a torn frame must not look like a clean end", err)
		}
		var again []byte
		for i := range got {
			if again, err = appendFrame(again, &got[i]); err != nil {
				t.Fatalf("message %d read but cannot be framed again: %v", i, err)
			}
		}
		fr = newFrameReader(bytes.NewReader(again), 512)
		for i := range got {
			var m raftpb.Message
			if err := fr.message(&m); err != nil {
				t.Fatalf("re-framed message %d: %v", i, err)
			}
			if !bytes.Equal(mustMarshal(t, &m), mustMarshal(t, &got[i])) {
				t.Fatalf("round trip of message %d: %v, want %v", i, m, got[i])
			}
		}
		if err := fr.message(&raftpb.Message{}); err != io.EOF {
			t.Fatalf("after the re-framed messages: %v, want io.EOF", err)
		}
	})
}

func mustMarshal(t *testing.T, m *raftpb.Message) []byte {
	b, err := m.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	return b
}
