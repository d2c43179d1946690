package server

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/internal/testnet"

	"go.uber.org/goleak"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// NB: memberlist's probe goroutine outlives Shutdown by up to one probe
// interval: it waits on its ack channel until the probe's own timer fires,
// and memberlist offers no way to wait for it. Every other goroutine must
// be gone.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreTopFunction("github.com/hashicorp/memberlist.(*Memberlist).probeNode"))
}

// testCluster runs real servers in this process, each with its own bbolt
// files and real gRPC listeners on loopback.
type testCluster struct {
	t       testing.TB
	base    Config
	names   []string
	peers   map[string]string // name -> peer address
	servers map[string]*Server
	dirs    map[string]string
	conns   map[string]*grpc.ClientConn
	logs    syncBuffer
	// creds dial the members' gRPC ports; nil: plain text.
	creds credentials.TransportCredentials
	// member, if set, adjusts each member's configuration last.
	member func(name string, cfg *Config)
}

// syncBuffer collects every member's logs; they are printed if the test fails.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

type clusterOption func(*Config)

func withSnapshotEvery(entries, catchUp uint64) clusterOption {
	return func(c *Config) { c.SnapshotEntries, c.CatchUpEntries = entries, catchUp }
}

// freeAddr reserves a loopback port by binding and releasing it.
func freeAddr(t testing.TB) string { return testnet.FreeAddr(t) }

func testConfig(opts ...clusterOption) Config {
	cfg := DefaultConfig()
	cfg.TickInterval = 20 * time.Millisecond
	cfg.ElectionTicks = 10
	for _, o := range opts {
		o(&cfg)
	}
	return cfg
}

// singleMemberConfig is a valid configuration of a one-member cluster that
// is never started, for tests of Validate.
func singleMemberConfig(t *testing.T) Config {
	cfg := DefaultConfig()
	cfg.Name, cfg.DataDir = "a", t.TempDir()
	cfg.ListenPeer, cfg.ListenGRPC, cfg.ListenHTTP = "127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"
	cfg.InitialCluster = map[string]string{"a": "127.0.0.1:1"}
	return cfg
}

// checkDurationField validates singleMemberConfig with each of good and
// bad set by set: good must pass, bad must fail with a ConfigError on field.
func checkDurationField(t *testing.T, field string, set func(*Config, time.Duration), good, bad []time.Duration) {
	t.Helper()
	for _, d := range good {
		cfg := singleMemberConfig(t)
		set(&cfg, d)
		if err := cfg.Validate(); err != nil {
			t.Errorf("%s %v refused: %v", field, d, err)
		}
	}
	for _, d := range bad {
		cfg := singleMemberConfig(t)
		set(&cfg, d)
		var ce *ConfigError
		if err := cfg.Validate(); !errors.As(err, &ce) || ce.Field != field {
			t.Errorf("%s %v: got %v, want a ConfigError on %s", field, d, err, field)
		}
	}
}

func newTestCluster(t testing.TB, n int, opts ...clusterOption) *testCluster {
	t.Helper()
	return newTestClusterWith(t, n, nil, opts...)
}

// newTestClusterWith is newTestCluster with member adjusting each
// member's configuration (nil: none).
func newTestClusterWith(t testing.TB, n int, member func(name string, cfg *Config), opts ...clusterOption) *testCluster {
	t.Helper()
	c := &testCluster{
		t: t, base: testConfig(opts...), peers: map[string]string{}, servers: map[string]*Server{},
		dirs: map[string]string{}, conns: map[string]*grpc.ClientConn{}, member: member,
	}
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("n%d", i)
		c.names = append(c.names, name)
		c.peers[name] = freeAddr(t)
		c.dirs[name] = filepath.Join(t.TempDir(), name)
	}
	for _, name := range c.names {
		c.start(name, false)
	}
	t.Cleanup(func() {
		c.close()
		if t.Failed() {
			c.logs.mu.Lock()
			out := c.logs.b.Bytes()
			if len(out) > 20000 {
				out = out[len(out)-20000:]
			}
			t.Logf("cluster logs (tail):\n%s", out)
			c.logs.mu.Unlock()
		}
	})
	c.waitLeader()
	return c
}

// start (re)starts a member with its data dir.
func (c *testCluster) start(name string, join bool) *Server {
	c.t.Helper()
	cfg := c.base
	cfg.Name = name
	cfg.DataDir = c.dirs[name]
	cfg.ListenPeer = c.peers[name]
	cfg.ListenGRPC = "127.0.0.1:0"
	cfg.ListenHTTP = "127.0.0.1:0"
	cfg.Join = join
	cfg.InitialCluster = map[string]string{}
	for n, a := range c.peers {
		cfg.InitialCluster[n] = a
	}
	cfg.Logger = slog.New(slog.NewTextHandler(&c.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if c.member != nil {
		c.member(name, &cfg)
	}
	s, err := New(cfg)
	if err != nil {
		c.t.Fatalf("start %s: %v", name, err)
	}
	s.Start()
	c.servers[name] = s
	return s
}

// addLearner adds name as a learner through via and starts it.
func (c *testCluster) addLearner(via, name string) {
	c.t.Helper()
	addr := c.add(name)
	if err := retryUnavailable(c.t, func(ctx context.Context) error {
		_, err := c.cluster(via).AddMember(ctx, &lodestonepb.AddMemberRequest{Name: name, PeerAddr: addr, Learner: true})
		return err
	}); err != nil {
		c.t.Fatalf("add learner %s: %v", name, err)
	}
	c.start(name, true)
}

// add prepares a new member's address and data dir without starting it.
func (c *testCluster) add(name string) string {
	c.names = append(c.names, name)
	c.peers[name] = freeAddr(c.t)
	c.dirs[name] = filepath.Join(c.t.TempDir(), name)
	return c.peers[name]
}

func (c *testCluster) stop(name string) {
	c.t.Helper()
	s := c.servers[name]
	if s == nil {
		return
	}
	if conn := c.conns[name]; conn != nil {
		conn.Close()
		delete(c.conns, name)
	}
	if err := s.Close(); err != nil {
		c.t.Errorf("stop %s: %v", name, err)
	}
	delete(c.servers, name)
}

func (c *testCluster) close() {
	names := make([]string, 0, len(c.servers))
	for n := range c.servers {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		c.stop(n)
	}
}

func (c *testCluster) conn(name string) *grpc.ClientConn {
	c.t.Helper()
	if conn, ok := c.conns[name]; ok {
		return conn
	}
	creds := c.creds
	if creds == nil {
		creds = insecure.NewCredentials()
	}
	conn, err := grpc.NewClient(c.servers[name].GRPCAddr(), grpc.WithTransportCredentials(creds))
	if err != nil {
		c.t.Fatalf("dial %s: %v", name, err)
	}
	c.conns[name] = conn
	return conn
}

func (c *testCluster) kv(name string) lodestonepb.KVClient {
	return lodestonepb.NewKVClient(c.conn(name))
}

func (c *testCluster) cluster(name string) lodestonepb.ClusterClient {
	return lodestonepb.NewClusterClient(c.conn(name))
}

// electionTimeout is the configured base election timeout.
func (c *testCluster) electionTimeout() time.Duration {
	return time.Duration(c.base.ElectionTicks) * c.base.TickInterval
}

// waitLeader waits until every running member agrees on one leader and
// returns its name.
func (c *testCluster) waitLeader() string {
	c.t.Helper()
	deadline := time.Now().Add(20 * c.electionTimeout())
	for time.Now().Before(deadline) {
		if name := c.agreedLeader(); name != "" {
			return name
		}
		c.waitAnyLeaderChange(50 * time.Millisecond)
	}
	c.t.Fatalf("no agreed leader within %v", 20*c.electionTimeout())
	return ""
}

func (c *testCluster) agreedLeader() string {
	var lead uint64
	for _, s := range c.servers {
		st := s.raft.Status()
		if st.Lead == 0 || (lead != 0 && st.Lead != lead) {
			return ""
		}
		lead = st.Lead
	}
	for name, s := range c.servers {
		if s.ID() == lead {
			return name
		}
	}
	return ""
}

// waitAnyLeaderChange blocks until some member sees a leader change or the
// timeout passes; it replaces polling with a sleep.
func (c *testCluster) waitAnyLeaderChange(timeout time.Duration) {
	cases := make([]<-chan struct{}, 0, len(c.servers))
	for _, s := range c.servers {
		cases = append(cases, s.raft.LeaderChanged())
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	done := make(chan struct{})
	defer close(done)
	hit := make(chan struct{}, len(cases))
	for _, ch := range cases {
		go func() {
			select {
			case <-ch:
				hit <- struct{}{}
			case <-done:
			}
		}()
	}
	select {
	case <-hit:
	case <-timer.C:
	}
}

func (c *testCluster) follower() string {
	c.t.Helper()
	lead := c.waitLeader()
	for _, n := range c.names {
		if n != lead && c.servers[n] != nil {
			return n
		}
	}
	c.t.Fatal("no follower running")
	return ""
}

// followersOf lists the members other than lead, in member order.
func (c *testCluster) followersOf(lead string) []string {
	var fs []string
	for _, n := range c.names {
		if n != lead {
			fs = append(fs, n)
		}
	}
	return fs
}

// waitApplied waits until member name has applied index.
func (c *testCluster) waitApplied(name string, index uint64) {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.servers[name].raft.WaitApplied(ctx, index); err != nil {
		c.t.Fatalf("%s did not apply index %d: %v (applied %d)", name, index, err, c.servers[name].raft.Applied())
	}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// put writes key, retrying while the server answers Unavailable (which
// promises the write was not applied), as a client would.
func put(t *testing.T, kv lodestonepb.KVClient, key, value string) *lodestonepb.PutResponse {
	t.Helper()
	ctx := ctxT(t)
	for {
		resp, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: []byte(key), Value: []byte(value)})
		if status.Code(err) == codes.Unavailable && ctx.Err() == nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("put %q: %v", key, err)
		}
		return resp
	}
}

func get(t *testing.T, kv lodestonepb.KVClient, key string, c lodestonepb.Consistency) *lodestonepb.KeyValue {
	t.Helper()
	resp, err := kv.Get(ctxT(t), &lodestonepb.GetRequest{Key: []byte(key), Consistency: c})
	if err != nil {
		t.Fatalf("get %q: %v", key, err)
	}
	return resp.Kv
}

// publishedOn reports whether on's store holds every member's client
// addresses: each member writes them once at start, an entry a test that
// counts entries must let land first.
func (c *testCluster) publishedOn(on *Server) bool {
	members := on.Store().Members()
	for _, s := range c.servers {
		i := slices.IndexFunc(members, func(m *lodestonepb.Member) bool { return m.Id == s.raft.ID() })
		if i < 0 || members[i].GrpcAddr != s.advertiseGRPC || members[i].HttpAddr != s.advertiseHTTP {
			return false
		}
	}
	return true
}

// waitFor polls cond until it holds or within passes.
func waitFor(t *testing.T, within time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("condition not met within %v", within)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// retryUnavailable runs call until it returns something other than
// Unavailable (which promises nothing was applied), as a client would.
func retryUnavailable(t testing.TB, call func(ctx context.Context) error) error {
	t.Helper()
	ctx := ctxT(t)
	for {
		err := call(ctx)
		if status.Code(err) != codes.Unavailable || ctx.Err() != nil {
			return err
		}
		time.Sleep(20 * time.Millisecond)
	}
}
