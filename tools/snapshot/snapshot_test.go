package snapshot_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/clusterid"

	"github.com/lodestone-kv/lodestone/internal/testnet"

	"go.uber.org/goleak"

	"github.com/lodestone-kv/lodestone/client"
	"github.com/lodestone-kv/lodestone/server"
	"github.com/lodestone-kv/lodestone/tools/snapshot"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func freeAddr(t *testing.T) string { return testnet.FreeAddr(t) }

// cluster is a set of real servers in this process over loopback sockets.
type cluster struct {
	t       *testing.T
	peers   map[string]string
	dirs    map[string]string
	servers map[string]*server.Server
}

func newCluster(t *testing.T, names ...string) *cluster {
	c := &cluster{t: t, peers: map[string]string{}, dirs: map[string]string{}, servers: map[string]*server.Server{}}
	for _, n := range names {
		c.peers[n] = freeAddr(t)
		c.dirs[n] = filepath.Join(t.TempDir(), n)
	}
	t.Cleanup(c.stopAll)
	return c
}

func (c *cluster) start(name string, initial map[string]string) *server.Server {
	c.t.Helper()
	cfg := server.DefaultConfig()
	cfg.TickInterval = 20 * time.Millisecond
	cfg.Name, cfg.DataDir, cfg.ListenPeer = name, c.dirs[name], c.peers[name]
	cfg.ListenGRPC, cfg.ListenHTTP = "127.0.0.1:0", "127.0.0.1:0"
	cfg.InitialCluster = map[string]string{}
	for n, a := range initial {
		cfg.InitialCluster[n] = a
	}
	s, err := server.New(cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	s.Start()
	c.servers[name] = s
	return s
}

func (c *cluster) stop(name string) {
	c.t.Helper()
	if s := c.servers[name]; s != nil {
		if err := s.Close(); err != nil {
			c.t.Errorf("close %s: %v", name, err)
		}
		delete(c.servers, name)
	}
}

func (c *cluster) stopAll() {
	for n := range c.servers {
		c.stop(n)
	}
}

func (c *cluster) endpoints() []string {
	var eps []string
	for _, s := range c.servers {
		eps = append(eps, s.GRPCAddr())
	}
	return eps
}

func (c *cluster) client() *client.Client {
	c.t.Helper()
	cl, err := client.New(client.Config{Endpoints: c.endpoints(), RequestTimeout: 5 * time.Second})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cl.Close() })
	return cl
}

// eventually polls cond until it holds or the deadline passes.
func eventually(t *testing.T, d time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: still failing after %v: %v", what, d, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func putKeys(t *testing.T, cl *client.Client, prefix string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		eventually(t, 10*time.Second, "put", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := cl.Put(ctx, fmt.Sprintf("%s%03d", prefix, i), []byte(fmt.Sprintf("v%d", i)))
			return err
		})
	}
}

func countKeys(cl *client.Client, prefix string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	resp, err := cl.Range(ctx, prefix)
	if err != nil {
		return 0, err
	}
	return len(resp.GetKvs()), nil
}

// TestSaveInspectRestore saves a snapshot from a live three-node cluster,
// refuses damaged copies, restores it into a new three-node cluster with
// other names and checks that the new cluster serves every key.
func TestSaveInspectRestore(t *testing.T) {
	src := newCluster(t, "a1", "a2", "a3")
	for n := range src.peers {
		src.start(n, src.peers)
	}
	cl := src.client()
	putKeys(t, cl, "k/", 50)

	path := filepath.Join(t.TempDir(), "backup.snap")
	var progress bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	in, err := snapshot.Save(ctx, snapshot.SaveOptions{Endpoints: src.endpoints(), Path: path}, &progress)
	if err != nil {
		t.Fatalf("save: %v", err)
	}
	if !strings.Contains(progress.String(), "saving snapshot [") || !strings.Contains(progress.String(), "100%") {
		t.Errorf("progress %q shows no finished bar", progress.String())
	}
	if got, want := in.Keys, 50; got != want {
		t.Errorf("keys = %d, want %d", got, want)
	}
	if got, want := len(in.Members), 3; got != want {
		t.Errorf("members = %d, want %d (%+v)", got, want, in.Members)
	}
	if in.Index == 0 || in.Term == 0 {
		t.Errorf("index %d term %d, want both > 0", in.Index, in.Term)
	}
	src.stopAll()

	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		data []byte
		want string
	}{
		{"truncated", raw[:len(raw)-100], "truncated"},
		{"cut in header", raw[:10], "truncated"},
		{"flipped byte", flip(raw, len(raw)/2), "checksum mismatch"},
		{"not a snapshot", []byte("hello, this is not a snapshot file at all"), "bad magic"},
		{"trailing bytes", append(append([]byte(nil), raw...), 1, 2, 3), "unexpected bytes after the checksum"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := filepath.Join(t.TempDir(), "bad.snap")
			if err := os.WriteFile(bad, tc.data, 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := snapshot.Inspect(bad)
			if !errors.Is(err, snapshot.ErrDamaged) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("inspect: err = %v, want ErrDamaged saying %q", err, tc.want)
			}
			dir := filepath.Join(t.TempDir(), "data")
			_, err = snapshot.Restore(snapshot.RestoreOptions{Path: bad, DataDir: dir, Name: "b1", InitialCluster: map[string]string{"b1": "127.0.0.1:1"}}, &bytes.Buffer{})
			if !errors.Is(err, snapshot.ErrDamaged) {
				t.Fatalf("restore: err = %v, want ErrDamaged", err)
			}
			if ents, _ := os.ReadDir(dir); len(ents) != 0 {
				t.Errorf("a refused restore left %d entries in the data dir", len(ents))
			}
		})
	}

	dst := newCluster(t, "b1", "b2", "b3")
	for n := range dst.peers {
		var out bytes.Buffer
		if _, err := snapshot.Restore(snapshot.RestoreOptions{Path: path, DataDir: dst.dirs[n], Name: n, InitialCluster: dst.peers}, &out); err != nil {
			t.Fatalf("restore %s: %v", n, err)
		}
	}
	// Every restored member keeps the saved cluster's id, with no step
	// between them.
	srcID, ok, err := clusterid.Load(src.dirs["a1"])
	if err != nil || !ok {
		t.Fatalf("source cluster id: %v (found %v)", err, ok)
	}
	for n := range dst.peers {
		got, ok, err := clusterid.Load(dst.dirs[n])
		if err != nil || !ok || got != srcID {
			t.Errorf("%s restored into cluster %s (found %v, %v), want %s", n, got, ok, err, srcID)
		}
	}
	// A second restore into a used dir is refused.
	if _, err := snapshot.Restore(snapshot.RestoreOptions{Path: path, DataDir: dst.dirs["b1"], Name: "b1", InitialCluster: dst.peers}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Errorf("restore into a used dir: err = %v, want 'not empty'", err)
	}
	for n := range dst.peers {
		dst.start(n, dst.peers)
	}
	dcl := dst.client()
	eventually(t, 15*time.Second, "restored cluster serves every key", func() error {
		n, err := countKeys(dcl, "k/")
		if err == nil && n != 50 {
			err = fmt.Errorf("%d keys", n)
		}
		return err
	})
	putKeys(t, dcl, "after/", 1)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	ms, err := dcl.Members(ctx2)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range ms.GetMembers() {
		names = append(names, m.GetName())
	}
	if got, want := strings.Join(names, ","), "b1,b2,b3"; !sameSet(got, want) {
		t.Errorf("members = %s, want %s", got, want)
	}
}

func flip(b []byte, i int) []byte {
	out := append([]byte(nil), b...)
	out[i] ^= 0xff
	return out
}

func sameSet(a, b string) bool {
	as, bs := strings.Split(a, ","), strings.Split(b, ",")
	if len(as) != len(bs) {
		return false
	}
	m := map[string]int{}
	for _, x := range as {
		m[x]++
	}
	for _, x := range bs {
		m[x]--
	}
	for _, v := range m {
		if v != 0 {
			return false
		}
	}
	return true
}

// TestRecoverQuorumLoss loses two of three voters for good and recovers
// the survivor into a one-node cluster that keeps every acknowledged write.
func TestRecoverQuorumLoss(t *testing.T) {
	c := newCluster(t, "n1", "n2", "n3")
	for n := range c.peers {
		c.start(n, c.peers)
	}
	cl := c.client()
	putKeys(t, cl, "k/", 40)
	// Every member has applied the writes once a read through each sees them.
	for n, s := range c.servers {
		one, err := client.New(client.Config{Endpoints: []string{s.GRPCAddr()}, RequestTimeout: 5 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		eventually(t, 10*time.Second, n+" has the writes", func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			resp, err := one.Range(ctx, "k/", client.Stale())
			if err == nil && len(resp.GetKvs()) != 40 {
				err = fmt.Errorf("%d keys", len(resp.GetKvs()))
			}
			return err
		})
		one.Close()
	}

	// Refused while the node runs.
	_, err := snapshot.Recover(snapshot.RecoverOptions{DataDir: c.dirs["n1"], Name: "n1", LockTimeout: 100 * time.Millisecond}, &bytes.Buffer{})
	if !errors.Is(err, snapshot.ErrRunning) {
		t.Fatalf("recover of a running node: err = %v, want ErrRunning", err)
	}
	c.stopAll()
	// Wrong name: refused, nothing changed.
	if _, err := snapshot.Recover(snapshot.RecoverOptions{DataDir: c.dirs["n1"], Name: "zz"}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "not a voter") {
		t.Fatalf("recover with a wrong name: err = %v, want 'not a voter'", err)
	}
	var dry bytes.Buffer
	if _, err := snapshot.Recover(snapshot.RecoverOptions{DataDir: c.dirs["n1"], Name: "n1", DryRun: true}, &dry); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(dry.String(), "will remove 2 member(s)") || !strings.Contains(dry.String(), "dry run") {
		t.Errorf("dry run printed %q", dry.String())
	}
	var out bytes.Buffer
	plan, err := snapshot.Recover(snapshot.RecoverOptions{DataDir: c.dirs["n1"], Name: "n1"}, &out)
	if err != nil {
		t.Fatalf("recover: %v", err)
	}
	if got, want := len(plan.Removed), 2; got != want {
		t.Errorf("removed %d members, want %d: %s", got, want, out.String())
	}

	c.start("n1", map[string]string{"n1": c.peers["n1"]})
	one := c.client()
	eventually(t, 15*time.Second, "recovered node serves every key", func() error {
		n, err := countKeys(one, "k/")
		if err == nil && n != 40 {
			err = fmt.Errorf("%d keys", n)
		}
		return err
	})
	putKeys(t, one, "after/", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ms, err := one.Members(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(ms.GetMembers()); got != 1 {
		t.Errorf("members after recover = %d, want 1: %v", got, ms.GetMembers())
	}
}
