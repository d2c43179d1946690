package raftnode

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"

	"github.com/lodestone-kv/lodestone/internal/member"
	"github.com/lodestone-kv/lodestone/raftlog"
	"github.com/lodestone-kv/lodestone/raftlog/raftlogtest"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// interactionEnv runs several Nodes in the test goroutine, the way
// etcd-io/raft's rafttest.InteractionEnv runs RawNodes: nothing moves
// unless a script command moves it. It never calls Start. It calls the
// handlers the run loop's select calls (tick, stepOne, proposeOne,
// flushReads, proposeConfChange, transfer, handleReport, appendDone,
// saveSnapshot), each followed by handleReadies, and plays the other
// goroutines itself:
//
//   - the network: Send queues a message; a command delivers, drops or
//     reorders what is in flight. A partition drops the messages it finds
//     on a cut link when they come up for delivery.
//   - each node's log writer: the MsgStorageAppend messages handleReady
//     queues stay in appendQ until the disk is processed, which writes them
//     to a real raftlog.Log as runLogWriter would (nextAppendBatch,
//     writeAppend) and hands the result to appendDone. A held disk keeps
//     them queued; a failing disk fails the journal's writes under it.
//   - the snapshot encoder: maybeSnapshot's job is queued and run between
//     two deliveries.
//   - the clock: one fake clock for the cluster. A tick moves it by the
//     tick interval; a node waiting on After (a slow disk, a compaction
//     pause) moves it by what it waits.
//
// What a command changes is printed: roles and terms, applied indexes
// (marked when ahead of the node's durable log), snapshots, answered
// proposals and reads, and the nodes' own log lines at or above the log
// level; with tracing on, also every message delivered or dropped and
// every log write.
type interactionEnv struct {
	t     *testing.T
	clock *fakeClock
	cfg   envConfig

	nodes    []*envNode // in the order they were added: n1, n2, ...
	byID     map[uint64]*envNode
	ids      *strings.Replacer // member ids → names, log dirs → "" (rebuildIDs)
	sides    map[uint64]int    // partition side by node id; empty: no partition
	inflight []raftpb.Message  // sent, not yet delivered, in send order
	snapJobs []snapJob
	opened   int // Nodes opened so far, restarts included: seeds request ids

	proposals []envProposal
	reads     []envRead
	labels    map[byte]int // last label number by kind: p(roposal), c(onf change), r(ead)

	trace bool // print messages and log writes as they happen
	// onSend, when set, sees every message a node sends, as it is sent.
	onSend   func(from *envNode, m raftpb.Message)
	logLevel slog.LevelVar
	out      strings.Builder
}

// envConfig is what add-nodes sets for every node, joiners included.
type envConfig struct {
	tickInterval     time.Duration
	electionTicks    int
	heartbeatTicks   int
	snapshotEntries  uint64
	snapshotBytes    uint64
	catchUpEntries   uint64
	slowLeader       SlowLeaderConfig
	leaderChangeWait time.Duration
	noJournal        bool // every log write a raft.db commit (raftlog.Options.JournalBytes < 0)
}

// envStart is the fake clock's reading when an environment starts.
var envStart = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// settleRounds bounds one settle: a cluster that still has work after this
// many rounds of deliveries is livelocked, and the command says so.
const settleRounds = 100

func newInteractionEnv(t *testing.T) *interactionEnv {
	env := &interactionEnv{
		t:      t,
		clock:  &fakeClock{now: envStart},
		byID:   map[uint64]*envNode{},
		ids:    strings.NewReplacer(),
		sides:  map[uint64]int{},
		labels: map[byte]int{},
	}
	env.logLevel.Set(slog.LevelWarn)
	return env
}

// fakeClock is the cluster's one clock. Everything runs on the test
// goroutine, so After moves time on by d at once and returns a channel that
// has fired: a node that waits d makes d pass for every node.
type fakeClock struct{ now time.Time }

func (c *fakeClock) Now() time.Time { return c.now }

func (c *fakeClock) After(d time.Duration) <-chan time.Time {
	c.advance(d)
	ch := make(chan time.Time, 1)
	ch <- c.now
	return ch
}

func (c *fakeClock) advance(d time.Duration) {
	if d > 0 {
		c.now = c.now.Add(d)
	}
}

// envNode is one member: its Node and what stands in for its goroutines.
type envNode struct {
	name   string
	id     uint64
	n      *Node
	log    *raftlog.Log
	dir    string // the log's, a temporary directory
	faults *Faults
	peers  map[uint64]bool // what the Node told its Sender: SetPeer adds, RemovePeer drops

	diskHeld  bool       // log writes stay queued
	diskFails bool       // the journal's writes and syncs fail
	stopped   error      // what stopped the loop; nil while it runs
	votesSent int        // MsgPreVote and MsgVote sent, so campaign sees a new election
	queued    []proposal // registered by propose queued, not yet handed to the loop
	seen      nodeView
}

// nodeView is what the trace last reported of a node.
type nodeView struct {
	state   raft.StateType
	lead    uint64
	term    uint64
	applied uint64
	snap    uint64
	removed bool
}

type snapJob struct {
	node *envNode
	run  func() snapResult
}

type envProposal struct {
	label string
	node  *envNode
	ch    <-chan proposalResult
}

type envRead struct {
	label string
	node  *envNode
	round *readRound
}

// envSender is a node's transport: it knows the peers the node told it of
// and queues messages for the environment to deliver.
type envSender struct {
	env  *interactionEnv
	node *envNode
}

func (s envSender) Send(m raftpb.Message) {
	if m.Type == raftpb.MsgSnap {
		s.env.t.Errorf("%s sent a MsgSnap through Send, not SendSnapshot", s.node.name)
	}
	s.env.send(s.node, m)
}

// SendSnapshot reads the data as the peer transport's stream does and
// queues the message with it.
func (s envSender) SendSnapshot(m raftpb.Message, data io.ReadCloser, size int64) {
	defer data.Close()
	b, err := io.ReadAll(data)
	if err == nil && int64(len(b)) != size {
		err = fmt.Errorf("read %d bytes, announced %d", len(b), size)
	}
	if err != nil {
		s.env.t.Errorf("%s: read snapshot to send: %v", s.node.name, err)
		return
	}
	snap := *m.Snapshot
	snap.Data = b
	m.Snapshot = &snap
	s.env.send(s.node, m)
}

func (s envSender) SetPeer(id uint64, _ string) error {
	s.node.peers[id] = true
	return nil
}

func (s envSender) RemovePeer(id uint64) { delete(s.node.peers, id) }

// SetLearners does nothing: the environment delivers every message when
// a command says so, and holds none.
func (envSender) SetLearners([]uint64) {}

// addNode creates a member and its log, store and hub, tells its Sender of
// cluster as Start would, and leaves it stopped in the sense that no
// goroutine runs it: the environment does.
func (env *interactionEnv) addNode(name string, cluster map[string]string, join bool) (*envNode, error) {
	en := &envNode{name: name, id: member.ID(name), dir: env.t.TempDir(), faults: &Faults{}, peers: map[uint64]bool{}}
	if err := env.openNode(en, cluster, join); err != nil {
		return nil, err
	}
	env.nodes = append(env.nodes, en)
	env.byID[en.id] = en
	env.rebuildIDs()
	for _, name := range sortedKeys(cluster) {
		if err := en.n.sender.SetPeer(member.ID(name), cluster[name]); err != nil {
			return nil, err
		}
	}
	en.seen = env.view(en)
	return en, nil
}

// openNode opens en's log in its directory, a new store and hub, and a Node
// over them, as a server process starting would.
func (env *interactionEnv) openNode(en *envNode, cluster map[string]string, join bool) error {
	t := env.t
	dir := en.dir
	fs := &raftlogtest.FaultFS{Fail: func(op raftlogtest.Op, path string) error {
		if en.diskFails && strings.HasSuffix(path, "raft.wal") && (op == raftlogtest.OpWrite || op == raftlogtest.OpDatasync) {
			return errDiskFailed
		}
		return nil
	}}
	opts := raftlog.Options{FS: fs, RotateFreeRatio: -1}
	if env.cfg.noJournal {
		opts.JournalBytes = -1
	}
	l, err := raftlog.Open(dir, opts)
	if err != nil {
		return err
	}
	en.log = l
	t.Cleanup(func() { _ = l.Close() }) // NB: a failed disk leaves the log refusing to close cleanly
	hub, err := watch.New(watch.Config{Shards: 1, ProgressInterval: -1})
	if err != nil {
		return err
	}
	t.Cleanup(func() { _ = hub.Close() })
	n, err := New(Config{
		ID: en.id, Log: l, Store: store.New(), Hub: hub, Sender: envSender{env, en},
		InitialCluster: cluster, Join: join,
		TickInterval: env.cfg.tickInterval, ElectionTicks: env.cfg.electionTicks, HeartbeatTicks: env.cfg.heartbeatTicks,
		Clock:           env.clock,
		SnapshotEntries: env.cfg.snapshotEntries, SnapshotBytes: env.cfg.snapshotBytes, CatchUpEntries: env.cfg.catchUpEntries,
		SlowLeader: env.cfg.slowLeader, Faults: en.faults, LeaderChangeWait: env.cfg.leaderChangeWait,
		Logger:     slog.New(slog.NewTextHandler(nodeLogWriter{env, en}, &slog.HandlerOptions{Level: &env.logLevel, ReplaceAttr: dropTime})),
		Registerer: prometheus.NewRegistry(),
	})
	if err != nil {
		return err
	}
	t.Cleanup(n.Stop)
	en.n = n
	n.startSnapshot = func(job func() snapResult) { env.snapJobs = append(env.snapJobs, snapJob{en, job}) }
	// NB: New seeds request ids from the clock, which reads the same for
	// every node here; ids that collide across nodes (or across one
	// node's lives) would answer one waiter with another's entry.
	env.opened++
	n.nextID.Store(uint64(env.opened) << 40)
	return nil
}

// restart crashes en and starts it again from its directory: what its
// log writer had not written is lost, its store and hub are new, and the
// Node restores them from the newest snapshot and replays the log.
func (env *interactionEnv) restart(en *envNode) error {
	en.n.Stop()
	if err := en.log.Close(); err != nil {
		return err
	}
	en.stopped = nil
	en.diskHeld = false
	if err := env.openNode(en, nil, false); err != nil {
		return err
	}
	for _, m := range en.n.store.Members() {
		if err := en.n.sender.SetPeer(m.Id, m.PeerAddr); err != nil {
			return err
		}
	}
	first, _ := en.log.FirstIndex()
	last, _ := en.log.LastIndex()
	env.printf("%s: restarted; log %d..%d, snapshot %d, applied %d", en.name, first, last, en.n.snapIndex, en.n.appliedIndex)
	en.seen = env.view(en)
	env.step(en, func() error { return nil })
	return nil
}

var errDiskFailed = errors.New("injected disk failure")

// rebuildIDs lets output name members instead of printing their ids (hex
// as the loop logs them, decimal as raft does), and name log files without
// the temporary directory, which differs every run.
func (env *interactionEnv) rebuildIDs() {
	var pairs []string
	for _, en := range env.nodes {
		pairs = append(pairs, fmt.Sprintf("%x", en.id), en.name, fmt.Sprint(en.id), en.name, en.dir+string(filepath.Separator), "")
	}
	env.ids = strings.NewReplacer(pairs...)
}

func (env *interactionEnv) name(id uint64) string {
	if en, ok := env.byID[id]; ok {
		return en.name
	}
	return fmt.Sprintf("%x", id)
}

// --- the network --------------------------------------------------------------

func (env *interactionEnv) send(from *envNode, m raftpb.Message) {
	if m.To == from.id {
		return
	}
	if env.onSend != nil {
		env.onSend(from, m)
	}
	if m.Type == raftpb.MsgPreVote || m.Type == raftpb.MsgVote {
		from.votesSent++
	}
	if !from.peers[m.To] {
		// As the peer transport does: a message to a member it was not
		// told of is dropped, and a dropped proposal answered.
		env.tracef("%s dropped: %s knows no such peer", env.describeMsg(m), from.name)
		from.n.Dropped(m)
		return
	}
	env.inflight = append(env.inflight, m)
}

// cut reports whether a partition separates a and b.
func (env *interactionEnv) cut(a, b uint64) bool {
	return len(env.sides) > 0 && env.sides[a] != env.sides[b]
}

// deliver hands m to its recipient, or drops it. After a MsgSnap the
// sender hears how it went, as the transport's snapshot stream reports.
func (env *interactionEnv) deliver(m raftpb.Message, drop bool) {
	from, to := env.byID[m.From], env.byID[m.To]
	why := ""
	switch {
	case drop:
		why = "dropped"
	case to == nil || to.stopped != nil:
		why = "dropped: recipient stopped"
	case env.cut(m.From, m.To):
		why = "dropped: partitioned"
	}
	if why == "" {
		env.tracef("%s", env.describeMsg(m))
		env.step(to, func() error { to.n.stepOne(m); return nil })
	} else {
		env.tracef("%s %s", env.describeMsg(m), why)
	}
	if m.Type == raftpb.MsgSnap && from != nil {
		st := raft.SnapshotFinish
		if why != "" {
			st = raft.SnapshotFailure
		}
		env.step(from, func() error { from.n.handleReport(report{to: m.To, snapshot: true, snapStatus: st}); return nil })
	}
}

// --- driving nodes --------------------------------------------------------------

// step runs one input of en's loop, then handles the Readies it made, as
// the run loop does after every select case; an error stops en's loop.
func (env *interactionEnv) step(en *envNode, input func() error) {
	if en.stopped != nil {
		return
	}
	err := input()
	if err == nil {
		err = en.n.handleReadies()
	}
	if err != nil {
		env.stop(en, err)
	}
	env.report(en)
}

// stop does what the run loop does on a fatal error.
func (env *interactionEnv) stop(en *envNode, err error) {
	en.stopped = err
	en.n.fatal.Store(&err)
	en.n.failReads(err)
	env.printf("%s: loop stopped: %s", en.name, journalOffset.ReplaceAllString(env.ids.Replace(err.Error()), "at N"))
}

// journalOffset matches the journal offset in a write error: which of the
// journal's two slots takes a write depends on when the background
// checkpoint switched them, which no script controls.
var journalOffset = regexp.MustCompile(`at [0-9]+`)

// writeDisk does what the log writer does with everything queued: one
// write per batch, each handed to the loop. After a failed write the rest
// is dropped, as the writer stops.
func (env *interactionEnv) writeDisk(en *envNode) {
	if en.stopped != nil {
		return
	}
	msgs := en.n.appendQ.takeAll(nil)
	for len(msgs) > 0 && en.stopped == nil {
		var b appendBatch
		b, msgs = nextAppendBatch(msgs)
		d := en.n.writeAppend(b)
		if b.snap != nil || len(b.ents) > 0 || !raft.IsEmptyHardState(b.hs) || d.err != nil {
			env.tracef("%s: log write: %s", en.name, env.describeWrite(b, d))
		}
		env.step(en, func() error { return en.n.appendDone(d) })
	}
}

// pendingWrites reports whether en's log writer has work queued.
func (en *envNode) pendingWrites() bool {
	en.n.appendQ.mu.Lock()
	defer en.n.appendQ.mu.Unlock()
	return len(en.n.appendQ.msgs) > 0
}

// runSnapshots runs the queued snapshot jobs, as goSnapshot's goroutine
// would, and hands each result to its loop.
func (env *interactionEnv) runSnapshots() bool {
	jobs := env.snapJobs
	env.snapJobs = nil
	for _, j := range jobs {
		en := j.node
		if en.stopped != nil {
			continue
		}
		res := j.run()
		env.printf("%s: %s", en.name, env.describeSnapshot(en, res))
		env.step(en, func() error {
			en.n.saveSnapshot(res)
			en.seen.snap = en.n.snapIndex // NB: reported above, not as an installed one
			return nil
		})
	}
	return len(jobs) > 0
}

// settle delivers every message, writes every disk that is not held and
// runs every snapshot job, round after round, until nothing is left to do.
func (env *interactionEnv) settle() error {
	for range settleRounds {
		if !env.settleRound() {
			return nil
		}
	}
	return fmt.Errorf("still busy after %d rounds of deliveries", settleRounds)
}

func (env *interactionEnv) settleRound() bool {
	busy := false
	for _, en := range env.nodes {
		if en.stopped == nil && !en.diskHeld && en.pendingWrites() {
			env.writeDisk(en)
			busy = true
		}
	}
	busy = env.runSnapshots() || busy
	msgs := env.inflight
	env.inflight = nil
	for _, m := range msgs {
		env.deliver(m, false)
	}
	return busy || len(msgs) > 0
}

// tickRound moves the clock by one tick, ticks nodes and settles.
func (env *interactionEnv) tickRound(nodes []*envNode) error {
	env.clock.advance(env.cfg.tickInterval)
	for _, en := range nodes {
		env.step(en, func() error { en.n.tick(); return nil })
	}
	return env.settle()
}

// campaign ticks en alone until it starts an election: it leaves the
// follower state, or, already campaigning, asks for votes again. Raft
// draws the election timeout at random, so the clock is then set to two
// election timeouts after the start whatever the draw took.
func (env *interactionEnv) campaign(en *envNode) error {
	limit := 2 * env.cfg.electionTicks
	end := env.clock.now.Add(time.Duration(limit) * env.cfg.tickInterval)
	wasFollower := en.n.rn.BasicStatus().RaftState == raft.StateFollower
	votes := en.votesSent
	for range limit {
		env.clock.advance(env.cfg.tickInterval)
		env.step(en, func() error { en.n.tick(); return nil })
		st := en.n.rn.BasicStatus().RaftState
		if (wasFollower && st != raft.StateFollower) || en.votesSent > votes {
			env.clock.now = end
			return nil
		}
	}
	return fmt.Errorf("%s did not campaign within %d ticks", en.name, limit)
}

// --- what the trace reports -----------------------------------------------------

func (env *interactionEnv) view(en *envNode) nodeView {
	st := en.n.rn.BasicStatus()
	v := nodeView{state: st.RaftState, lead: st.Lead, term: st.Term, applied: en.n.appliedIndex, snap: en.n.snapIndex}
	select {
	case <-en.n.Removed():
		v.removed = true
	default:
	}
	return v
}

// report prints what changed on en since the last report, then every
// proposal and read answered meanwhile.
func (env *interactionEnv) report(en *envNode) {
	was, now := en.seen, env.view(en)
	en.seen = now
	if was.state != now.state || was.lead != now.lead || was.term != now.term {
		env.printf("%s: %s", en.name, env.describeRole(now))
	}
	from := was.applied + 1
	if now.snap > was.snap {
		env.printf("%s: installed snapshot %d", en.name, now.snap)
		from = now.snap + 1
	}
	if now.applied >= from {
		env.printf("%s: applied %s%s", en.name, span(from, now.applied), env.aheadOfLog(en, now.applied))
	}
	if now.removed && !was.removed {
		env.printf("%s: removed from the cluster", en.name)
	}
	env.reportAnswers()
}

// aheadOfLog notes an applied index the node's own log does not hold yet.
func (env *interactionEnv) aheadOfLog(en *envNode, applied uint64) string {
	last, err := en.log.LastIndex()
	if err != nil || last >= applied {
		return ""
	}
	return fmt.Sprintf(" (ahead of its log, which ends at %d)", last)
}

func (env *interactionEnv) reportAnswers() {
	env.proposals = slices.DeleteFunc(env.proposals, func(p envProposal) bool {
		select {
		case r := <-p.ch:
			if r.err != nil {
				env.printf("%s: %s", p.label, env.describeErr(r.err))
			} else {
				env.printf("%s: applied at %d on %s", p.label, r.index, p.node.name)
			}
			return true
		default:
			return false
		}
	})
	env.reads = slices.DeleteFunc(env.reads, func(r envRead) bool {
		select {
		case <-r.round.done:
			if r.round.err != nil {
				env.printf("%s: %s", r.label, env.describeErr(r.round.err))
			} else {
				env.printf("%s: read index %d on %s", r.label, r.round.index, r.node.name)
			}
			return true
		default:
			return false
		}
	})
}

func (env *interactionEnv) nextLabel(kind byte) string {
	env.labels[kind]++
	return fmt.Sprintf("%c%d", kind, env.labels[kind])
}

func (env *interactionEnv) printf(format string, args ...any) {
	fmt.Fprintf(&env.out, format, args...)
	env.out.WriteByte('\n')
}

func (env *interactionEnv) tracef(format string, args ...any) {
	if env.trace {
		env.printf(format, args...)
	}
}

// nodeLogWriter puts a node's log lines in the output, naming members.
type nodeLogWriter struct {
	env  *interactionEnv
	node *envNode
}

func (w nodeLogWriter) Write(p []byte) (int, error) {
	w.env.printf("%s: %s", w.node.name, w.env.ids.Replace(strings.TrimSuffix(string(p), "\n")))
	return len(p), nil
}

func dropTime(groups []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey && len(groups) == 0 {
		return slog.Attr{}
	}
	return a
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// span renders an index range: "5" or "5..7".
func span(from, to uint64) string {
	if from == to {
		return fmt.Sprint(from)
	}
	return fmt.Sprintf("%d..%d", from, to)
}
