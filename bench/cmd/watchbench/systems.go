package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/bench/internal/harness"
	"github.com/lodestone-kv/lodestone/internal/ctxtime"
	"github.com/lodestone-kv/lodestone/internal/faulthook"
	"github.com/lodestone-kv/lodestone/internal/grpcopt"
)

// system is one store under test. Everything else (ports, pinning,
// connections, workload, verification) is shared, so all run the same way.
type system struct {
	name string
	// start launches the system and returns it ready to take writes.
	start func(ctx context.Context, workDir string) (*deployment, error)
	// put returns a put bound to one connection.
	put func(conn *grpc.ClientConn) func(ctx context.Context, key, value []byte) error
	// open opens one watch stream on conn.
	open func(ctx context.Context, conn *grpc.ClientConn) (watchStream, error)
	// dialOptions are the connection options of the system's own Go
	// client, so each side runs as its users run it.
	dialOptions []grpc.DialOption
}

// deployment is a running system: where to send writes (the leader) and
// watches (-watch-member), where their metrics are, and how to stop it.
type deployment struct {
	procs   []*harness.Proc
	dir     string
	target  string // gRPC address writes go to
	metrics string // URL of the target process's Prometheus metrics
	leader  int    // index in procs of the target process
	clients []string

	// The members the watch streams go to (-watch-member): their gRPC
	// addresses, metrics URLs and indices in procs. Connections take
	// them in turn.
	watchTargets []string
	watchMetrics []string
	watchers     []int

	memberMetrics []string // every process's metrics URL, by index in procs
}

// placeWatches points the watches at the members -watch-member names: the
// leader, the member after it, or every member but the leader (all of
// them if there is only one). metrics(i) is member i's metrics URL; it
// also records every member's, for the profiles.
func (d *deployment) placeWatches(metrics func(i int) string) {
	d.watchTargets, d.watchMetrics, d.watchers = nil, nil, nil
	for i := range d.clients {
		var on bool
		switch *flagWatchMember {
		case "leader":
			on = i == d.leader
		case "follower":
			on = i == (d.leader+1)%len(d.clients)
		case "followers":
			on = i != d.leader || len(d.clients) == 1
		}
		if on {
			d.watchTargets = append(d.watchTargets, d.clients[i])
			d.watchMetrics = append(d.watchMetrics, metrics(i))
			d.watchers = append(d.watchers, i)
		}
	}
	d.memberMetrics = make([]string, len(d.procs))
	for j := range d.procs {
		d.memberMetrics[j] = metrics(j)
	}
}

// slowWatchDisks makes every log write of the watch members wait delay,
// through a Lodestone server's fault hooks.
func (d *deployment) slowWatchDisks(ctx context.Context, delay time.Duration) error {
	for _, i := range d.watchers {
		addr := strings.TrimPrefix(strings.TrimSuffix(d.memberMetrics[i], "/metrics"), "http://")
		if err := faulthook.SetDiskDelay(ctx, addr, delay); err != nil {
			return err
		}
	}
	logf("log writes of the watch members %v wait %v each", d.watchers, delay)
	return nil
}

// watchStream is one bidirectional watch stream, whatever the system.
type watchStream interface {
	// Create asks for watch id on key (prefix: every key under it), from
	// now, or after index start when start > 0 (a resync). Not safe for
	// concurrent use with itself.
	Create(id int64, key []byte, prefix bool, start uint64) error
	// Recv appends the next message's responses to out (a grouped
	// Lodestone response holds several). Only one goroutine may call it.
	Recv(out []watchResp) ([]watchResp, error)
}

// watchResp is the part of a watch response the benchmark uses.
type watchResp struct {
	id       int64
	created  bool
	canceled bool
	reason   string
	resync   uint64 // with canceled: resume after this index
	events   []watchEvent
}

type watchEvent struct {
	index uint64
	value []byte
}

func dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	conn, err := grpc.NewClient("passthrough:///"+addr, append(opts, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))...)
	if err != nil {
		return nil, fmt.Errorf("dial %s: %w", addr, err)
	}
	return conn, nil
}

func (d *deployment) stop() error {
	err := harness.StopAll(d.procs, 10*time.Second)
	if !*flagKeep {
		if rerr := os.RemoveAll(d.dir); rerr != nil && err == nil {
			err = rerr
		}
	}
	return err
}

func (d *deployment) checkAlive() error {
	for _, p := range d.procs {
		if exited, err := p.Exited(); exited {
			return fmt.Errorf("%w: %s (%v)\n%s", harness.ErrExited, p.Name, err, p.LogTail(1500))
		}
	}
	return nil
}

func (d *deployment) logTails() string { return harness.LogTails("", d.procs, 1500) }

const members = 3

// startThree starts three members with args(i, names, peers, clients,
// https, dataDir), pinned to cpus, then waits for leader() to name one and
// for a put on it to succeed.
func startThree(ctx context.Context, name, bin, workDir, cpus string,
	args func(i int, names, peers, clients, https []string, dataDir string) []string,
	leader func(ctx context.Context, clients []string) (int, error),
	put func(conn *grpc.ClientConn) func(ctx context.Context, key, value []byte) error,
	metrics func(i int, clients, https []string) string,
) (_ *deployment, err error) {
	dir, err := os.MkdirTemp(workDir, name+"-")
	if err != nil {
		return nil, err
	}
	d := &deployment{dir: dir}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%s: %w%s", name, err, d.logTails())
			d.stop()
		}
	}()
	ports, err := harness.FreePorts(3 * members)
	if err != nil {
		return nil, err
	}
	var names, peers, https []string
	for i := range members {
		names = append(names, fmt.Sprintf("n%d", i+1))
		peers = append(peers, fmt.Sprintf("127.0.0.1:%d", ports[i]))
		d.clients = append(d.clients, fmt.Sprintf("127.0.0.1:%d", ports[members+i]))
		https = append(https, fmt.Sprintf("127.0.0.1:%d", ports[2*members+i]))
	}
	for i := range members {
		p, err := harness.Start(name+"-"+names[i], bin, args(i, names, peers, d.clients, https, filepath.Join(dir, names[i])),
			filepath.Join(dir, names[i]+".log"), cpus)
		if err != nil {
			return nil, err
		}
		d.procs = append(d.procs, p)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		if err := d.checkAlive(); err != nil {
			return nil, err
		}
		qctx, cancel := context.WithTimeout(ctx, time.Second)
		i, lerr := leader(qctx, d.clients)
		cancel()
		if lerr == nil {
			d.target, d.metrics, d.leader = d.clients[i], metrics(i, d.clients, https), i
			d.placeWatches(func(i int) string { return metrics(i, d.clients, https) })
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("no leader within 30s: %w", lerr)
		}
		if err := ctxtime.Sleep(ctx, 100*time.Millisecond); err != nil {
			return nil, err
		}
	}
	return d, probePut(ctx, d, put)
}

// probePut retries a put on the target until one is acknowledged.
func probePut(ctx context.Context, d *deployment, put func(conn *grpc.ClientConn) func(ctx context.Context, key, value []byte) error) error {
	conn, err := dial(d.target)
	if err != nil {
		return err
	}
	defer conn.Close()
	p := put(conn)
	deadline := time.Now().Add(20 * time.Second)
	for {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := p(pctx, []byte("watchbench/probe"), []byte("ok"))
		cancel()
		if err == nil {
			return nil
		}
		if aerr := d.checkAlive(); aerr != nil {
			return aerr
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("probe put on %s: %w", d.target, err)
		}
		if err := ctxtime.Sleep(ctx, 100*time.Millisecond); err != nil {
			return err
		}
	}
}

func initialCluster(names, peers []string) string {
	var parts []string
	for i := range names {
		parts = append(parts, names[i]+"="+peers[i])
	}
	return strings.Join(parts, ",")
}

var errNoLeader = errors.New("no member reports itself leader")

// ---- Lodestone ----

func lodestonePut(conn *grpc.ClientConn) func(ctx context.Context, key, value []byte) error {
	kv := lodestonepb.NewKVClient(conn)
	return func(ctx context.Context, key, value []byte) error {
		_, err := kv.Put(ctx, &lodestonepb.PutRequest{Key: key, Value: value})
		return err
	}
}

func lodestoneOpen(ctx context.Context, conn *grpc.ClientConn) (watchStream, error) {
	st, err := lodestonepb.NewWatchClient(conn).Watch(ctx)
	if err != nil {
		return nil, err
	}
	return lodestoneStream{st}, nil
}

type lodestoneStream struct {
	st lodestonepb.Watch_WatchClient
}

func (s lodestoneStream) Create(id int64, key []byte, prefix bool, start uint64) error {
	return s.st.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: &lodestonepb.WatchCreate{
		WatchId: id, Key: key, Prefix: prefix, StartIndex: start, Grouped: true}}})
}

func (s lodestoneStream) Recv(out []watchResp) ([]watchResp, error) {
	r, err := s.st.Recv()
	if err != nil {
		return out, err
	}
	events := func(evs []*lodestonepb.Event) []watchEvent {
		var xs []watchEvent
		for _, ev := range evs {
			xs = append(xs, watchEvent{index: ev.GetKv().GetModifyIndex(), value: ev.GetKv().GetValue()})
		}
		return xs
	}
	if gs := r.GetGroups(); len(gs) > 0 {
		for _, g := range gs {
			out = append(out, watchResp{id: g.GetWatchId(), events: events(g.GetEvents())})
		}
		return out, nil
	}
	return append(out, watchResp{id: r.GetWatchId(), created: r.GetCreated(), canceled: r.GetCanceled(), reason: r.GetCancelReason(),
		resync: r.GetResyncIndex(), events: events(r.GetEvents())}), nil
}

func lodestoneSystem(bin string) system {
	return system{
		name: "lodestone",
		// client/ dials with fixed flow-control windows; clientv3 keeps
		// gRPC's defaults (bandwidth estimation on).
		dialOptions: grpcopt.DialOptions(),
		put:         lodestonePut,
		open:        lodestoneOpen,
		start: func(ctx context.Context, workDir string) (*deployment, error) {
			return startThree(ctx, "lodestone", bin, workDir, *flagServerCPUs,
				func(i int, names, peers, clients, https []string, dataDir string) []string {
					args := []string{"server", "--name", names[i], "--data-dir", dataDir,
						"--listen-peer", peers[i], "--listen-grpc", clients[i], "--listen-http", https[i],
						"--initial-cluster", initialCluster(names, peers), "--log-level", "warn", "--enable-pprof", // NB: liveHeap and -pprof use it
						// NB: 200 probes/s, so a phase's poll-delay p99 rests on ~1,200 samples.
						"--poll-probe-interval", "5ms"}
					if *flagWatchDisk > 0 {
						args = append(args, "--fault-hooks")
					}
					return append(args, strings.Fields(*flagLodeArgs)...)
				},
				func(ctx context.Context, clients []string) (int, error) {
					var errs []error
					for i, addr := range clients {
						conn, err := dial(addr)
						if err != nil {
							return 0, err
						}
						st, err := lodestonepb.NewClusterClient(conn).Status(ctx, &lodestonepb.StatusRequest{})
						conn.Close()
						if err != nil {
							errs = append(errs, err)
							continue
						}
						if st.GetLeaderId() != 0 && st.GetLeaderId() == st.GetSelf().GetId() {
							return i, nil
						}
					}
					return 0, errors.Join(append(errs, errNoLeader)...)
				},
				lodestonePut,
				func(i int, _, https []string) string { return "http://" + https[i] + "/metrics" })
		},
	}
}

// ---- etcd ----

func etcdPut(conn *grpc.ClientConn) func(ctx context.Context, key, value []byte) error {
	kv := etcdserverpb.NewKVClient(conn)
	return func(ctx context.Context, key, value []byte) error {
		_, err := kv.Put(ctx, &etcdserverpb.PutRequest{Key: key, Value: value})
		return err
	}
}

type etcdStream struct {
	st etcdserverpb.Watch_WatchClient
}

func (s etcdStream) Create(id int64, key []byte, prefix bool, start uint64) error {
	cr := &etcdserverpb.WatchCreateRequest{Key: key, WatchId: id}
	if start > 0 {
		cr.StartRevision = int64(start) + 1 // etcd's start is inclusive
	}
	if prefix {
		cr.RangeEnd = []byte(clientv3.GetPrefixRangeEnd(string(key)))
	}
	return s.st.Send(&etcdserverpb.WatchRequest{RequestUnion: &etcdserverpb.WatchRequest_CreateRequest{CreateRequest: cr}})
}

func (s etcdStream) Recv(out []watchResp) ([]watchResp, error) {
	r, err := s.st.Recv()
	if err != nil {
		return out, err
	}
	resp := watchResp{id: r.GetWatchId(), created: r.GetCreated(), canceled: r.GetCanceled(), reason: r.GetCancelReason()}
	for _, ev := range r.GetEvents() {
		if ev.Type != mvccpb.PUT {
			continue
		}
		resp.events = append(resp.events, watchEvent{index: uint64(ev.Kv.ModRevision), value: ev.Kv.Value})
	}
	return append(out, resp), nil
}

func etcdSystem(bin string) system {
	return system{
		name: "etcd",
		put:  etcdPut,
		open: func(ctx context.Context, conn *grpc.ClientConn) (watchStream, error) {
			st, err := etcdserverpb.NewWatchClient(conn).Watch(ctx)
			if err != nil {
				return nil, err
			}
			return etcdStream{st}, nil
		},
		start: func(ctx context.Context, workDir string) (*deployment, error) {
			return startThree(ctx, "etcd", bin, workDir, *flagServerCPUs,
				func(i int, names, peers, clients, _ []string, dataDir string) []string {
					return []string{"--name", names[i], "--data-dir", dataDir, "--listen-peer", peers[i],
						"--listen-client", clients[i], "--initial-cluster", initialCluster(names, peers), "--log-level", "warn",
						"--enable-pprof"} // NB: for liveHeap
				},
				func(ctx context.Context, clients []string) (int, error) {
					cli, err := clientv3.New(clientv3.Config{Endpoints: clients, Logger: zap.NewNop()})
					if err != nil {
						return 0, err
					}
					defer cli.Close()
					var errs []error
					for i, ep := range clients {
						st, err := cli.Status(ctx, ep)
						if err != nil {
							errs = append(errs, err)
							continue
						}
						if st.Leader != 0 && st.Leader == st.Header.GetMemberId() {
							return i, nil
						}
					}
					return 0, errors.Join(append(errs, errNoLeader)...)
				},
				etcdPut,
				// etcd serves /metrics on its client URL.
				func(i int, clients, _ []string) string { return "http://" + clients[i] + "/metrics" })
		},
	}
}

// ---- the single-channel broadcaster ----

// broadcasterSystem runs bench/internal/broadcast in a child process (this
// binary with -serve-broadcaster), one process: it has no replication.
func broadcasterSystem(self string) system {
	return system{
		name: "broadcaster",
		// It speaks Lodestone's API, so Lodestone's client options.
		dialOptions: grpcopt.DialOptions(),
		put:         lodestonePut,
		open:        lodestoneOpen,
		start: func(ctx context.Context, workDir string) (_ *deployment, err error) {
			dir, err := os.MkdirTemp(workDir, "broadcaster-")
			if err != nil {
				return nil, err
			}
			ports, err := harness.FreePorts(2)
			if err != nil {
				return nil, err
			}
			grpcAddr, httpAddr := fmt.Sprintf("127.0.0.1:%d", ports[0]), fmt.Sprintf("127.0.0.1:%d", ports[1])
			p, err := harness.Start("broadcaster", self, []string{"-serve-broadcaster", "-grpc", grpcAddr, "-http", httpAddr},
				filepath.Join(dir, "broadcaster.log"), *flagServerCPUs)
			if err != nil {
				return nil, err
			}
			d := &deployment{procs: []*harness.Proc{p}, dir: dir, target: grpcAddr, metrics: "http://" + httpAddr + "/metrics", clients: []string{grpcAddr}}
			d.placeWatches(func(int) string { return d.metrics })
			if err := probePut(ctx, d, lodestonePut); err != nil {
				d.stop()
				return nil, fmt.Errorf("broadcaster: %w%s", err, d.logTails())
			}
			return d, nil
		},
	}
}

// watchHeap sums liveHeap over the members serving the watches.
func watchHeap(ctx context.Context, d *deployment) (float64, error) {
	var sum float64
	for _, url := range d.watchMetrics {
		b, err := liveHeap(ctx, url)
		if err != nil {
			return 0, err
		}
		sum += b
	}
	return sum, nil
}

// liveHeap measures a server's live heap from outside: three times, it
// has the server collect (a heap profile with gc=1, from its
// /debug/pprof/ next to the metrics URL) and then scrapes
// go_memstats_heap_alloc_bytes, and returns the smallest: right after a
// collection, allocated heap is the live heap plus what was allocated
// since. NB: an idle Go process never collects by itself (GC is paced by
// allocation, and a server with a heap floor waits for hundreds of MB),
// so heap_inuse at rest would count the previous phase's garbage.
func liveHeap(ctx context.Context, metricsURL string) (float64, error) {
	const alloc = "go_memstats_heap_alloc_bytes"
	gc := strings.TrimSuffix(metricsURL, "/metrics") + "/debug/pprof/heap?gc=1"
	best := -1.0
	for range 3 {
		resp, err := harness.Get(ctx, gc)
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return 0, fmt.Errorf("GET %s: %w", gc, err)
		}
		m, err := harness.Scrape(ctx, metricsURL, alloc)
		if err != nil {
			return 0, err
		}
		if best < 0 || m[alloc] < best {
			best = m[alloc]
		}
	}
	return best, nil
}
