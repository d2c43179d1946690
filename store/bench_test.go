package store

import (
	"bytes"
	"fmt"
	"io"
	"path/filepath"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store/valuefile"
)

func benchStore(b *testing.B, n int) (*Store, [][]byte) {
	b.Helper()
	s := New()
	keys := make([][]byte, n)
	for i := range keys {
		keys[i] = []byte(fmt.Sprintf("service/web/instance-%07d", i))
		s.Apply(uint64(i+1), &lodestonepb.Command{Op: &lodestonepb.Command_Put{Put: &lodestonepb.PutRequest{Key: keys[i], Value: make([]byte, 128)}}})
	}
	return s, keys
}

// BenchmarkApplyPut measures one Put on a store of 100k keys (overwrites,
// so the tree size stays constant).
func BenchmarkApplyPut(b *testing.B) {
	s, keys := benchStore(b, 100000)
	cmds := make([]*lodestonepb.Command, len(keys))
	for i, k := range keys {
		cmds[i] = &lodestonepb.Command{Op: &lodestonepb.Command_Put{Put: &lodestonepb.PutRequest{Key: k, Value: make([]byte, 128)}}}
	}
	idx := s.Index()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		idx++
		s.Apply(idx, cmds[i%len(cmds)])
	}
}

// BenchmarkApplyTxn measures a 4-op check-and-set transaction.
func BenchmarkApplyTxn(b *testing.B) {
	s, keys := benchStore(b, 100000)
	idx := s.Index()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		k := string(keys[i%len(keys)])
		idx++
		s.Apply(idx, txnCmd(op(GET, k), opSet(k, "v"), opSet(k+"/meta", "m"), op(CHECK_NOT_EXISTS, "nope")))
	}
}

// BenchmarkGet measures parallel point reads on a store of 100k keys.
func BenchmarkGet(b *testing.B) {
	s, keys := benchStore(b, 100000)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			if kv, _ := s.Get(keys[i%len(keys)]); kv == nil {
				b.Fatal("missing key")
			}
			i += 7919
		}
	})
}

// BenchmarkRange100 measures a 100-key page.
func BenchmarkRange100(b *testing.B) {
	s, _ := benchStore(b, 100000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if kvs, _, _ := s.Range([]byte("service/web/"), nil, 100, false); len(kvs) != 100 {
			b.Fatal("short page")
		}
	}
}

// BenchmarkSnapshotWrite measures encoding 100k keys.
func BenchmarkSnapshotWrite(b *testing.B) {
	s, _ := benchStore(b, 100000)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := s.Snapshot().WriteTo(io.Discard); err != nil {
			b.Fatal(err)
		}
	}
}

// benchCatalog registers nodes × perNode instances of service "web" (plus
// one node check per node) and returns the store.
func benchCatalog(b *testing.B, nodes, perNode int) *Store {
	b.Helper()
	s := New()
	idx := uint64(0)
	for n := range nodes {
		for i := range perNode {
			idx++
			name := fmt.Sprintf("n%05d", n)
			reg := regSvc(name, fmt.Sprintf("web-%d", i), "web", "v1")
			reg.GetCatalogRegister().Checks = []*lodestonepb.Check{
				{CheckId: "serfHealth", Status: PASSING},
				{CheckId: fmt.Sprintf("web-%d-http", i), ServiceId: fmt.Sprintf("web-%d", i), Status: PASSING},
			}
			s.Apply(idx, at(t0, reg))
		}
	}
	return s
}

// BenchmarkApplyCheckUpdate measures an agent's check transition on a
// catalog of 5000 nodes × 4 instances (each emits the instance's health).
func BenchmarkApplyCheckUpdate(b *testing.B) {
	s := benchCatalog(b, 5000, 4)
	idx := s.Index()
	cmds := [2]*lodestonepb.Command{at(t0, checkUpd("n00042", "web-1-http", WARNING, "slow")), at(t0, checkUpd("n00042", "web-1-http", PASSING, ""))}
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		idx++
		s.Apply(idx, cmds[i%2])
	}
}

// BenchmarkHealthService measures /v1/health/service/web?passing over
// 1000 instances.
func BenchmarkHealthService(b *testing.B) {
	s := benchCatalog(b, 250, 4)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if hs, _ := s.HealthService("web", []string{"v1"}, true); len(hs) != 1000 {
			b.Fatalf("%d instances", len(hs))
		}
	}
}

// scaleCommands are the encoded transactions that load n keys of 256 bytes
// in batches of 64 puts, as bench-scale loads them.
func scaleCommands(b *testing.B, n int) [][]byte {
	b.Helper()
	var out [][]byte
	for i := 0; i < n; i += 64 {
		txn := &lodestonepb.TxnRequest{}
		for k := i; k < min(i+64, n); k++ {
			txn.Ops = append(txn.Ops, &lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: fmt.Appendf(nil, "scale/%07d", k), Value: make([]byte, 256)})
		}
		data, err := proto.Marshal(&lodestonepb.Command{Op: &lodestonepb.Command_Txn{Txn: txn}})
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, data)
	}
	return out
}

// BenchmarkReplayKeys measures what a restart without a snapshot does per
// key: decode the logged transactions and apply them to an empty store.
func BenchmarkReplayKeys(b *testing.B) {
	const n = 200_000
	cmds := scaleCommands(b, n)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		s := New()
		for i, data := range cmds {
			var cmd lodestonepb.Command
			if err := proto.Unmarshal(data, &cmd); err != nil {
				b.Fatal(err)
			}
			s.Apply(uint64(i+1), &cmd)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/key")
}

// BenchmarkRestoreKeys measures what a restart from a snapshot does per
// key: restore the store from it.
func BenchmarkRestoreKeys(b *testing.B) {
	const n = 200_000
	s := New()
	for i, data := range scaleCommands(b, n) {
		var cmd lodestonepb.Command
		if err := proto.Unmarshal(data, &cmd); err != nil {
			b.Fatal(err)
		}
		s.Apply(uint64(i+1), &cmd)
	}
	var buf bytes.Buffer
	if _, err := s.Snapshot().WriteTo(&buf); err != nil {
		b.Fatal(err)
	}
	path := filepath.Join(b.TempDir(), "values")
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		// NB: a file opened afresh each time, as a restarting member does.
		v, err := valuefile.Open(path)
		if err != nil {
			b.Fatal(err)
		}
		if err := NewWithValues(v).Restore(bytes.NewReader(buf.Bytes())); err != nil {
			b.Fatal(err)
		}
		v.Close()
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/key")
}
