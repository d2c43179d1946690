package raftnode

import (
	"encoding/binary"
	"fmt"
	"log/slog"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"go.etcd.io/raft/v3"
	"go.etcd.io/raft/v3/raftpb"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/member"
)

// The commands of TestInteraction's scripts; the DSL is documented there.

func (env *interactionEnv) handleAddNodes(t *testing.T, d *datadriven.TestData) error {
	count := env.intArg(t, d, 0)
	env.cfg = envConfig{
		tickInterval: 100 * time.Millisecond, electionTicks: 10, heartbeatTicks: 1,
		snapshotEntries: 1000, catchUpEntries: 100,
		slowLeader: SlowLeaderConfig{Window: 10 * time.Second, Cooldown: 5 * time.Minute},
	}
	d.MaybeScanArgs(t, "election", &env.cfg.electionTicks)
	d.MaybeScanArgs(t, "heartbeat", &env.cfg.heartbeatTicks)
	d.MaybeScanArgs(t, "snapshot-entries", &env.cfg.snapshotEntries)
	d.MaybeScanArgs(t, "snapshot-bytes", &env.cfg.snapshotBytes)
	d.MaybeScanArgs(t, "catch-up", &env.cfg.catchUpEntries)
	d.MaybeScanArgs(t, "no-journal", &env.cfg.noJournal)
	env.cfg.tickInterval = env.durationArg(t, d, "tick", env.cfg.tickInterval)
	env.cfg.slowLeader.Threshold = env.durationArg(t, d, "slow-threshold", 0)
	env.cfg.slowLeader.Window = env.durationArg(t, d, "slow-window", env.cfg.slowLeader.Window)
	env.cfg.slowLeader.Cooldown = env.durationArg(t, d, "slow-cooldown", env.cfg.slowLeader.Cooldown)
	env.cfg.leaderChangeWait = env.durationArg(t, d, "leader-change-wait", 0)
	cluster := map[string]string{}
	for i := 1; i <= count; i++ {
		name := fmt.Sprintf("n%d", i)
		cluster[name] = name + ":2380"
	}
	for _, name := range sortedKeys(cluster) {
		en, err := env.addNode(name, cluster, false)
		if err != nil {
			return err
		}
		// The bootstrap entries: the first Ready, as a started loop's
		// first input would handle it.
		env.step(en, func() error { return nil })
	}
	return env.settle()
}

func (env *interactionEnv) handleTick(t *testing.T, d *datadriven.TestData) error {
	count := env.intArg(t, d, 0)
	nodes := env.nodesArg(t, d, "nodes")
	env.trace = d.HasArg("trace")
	for range count {
		if err := env.tickRound(nodes); err != nil {
			return err
		}
	}
	return nil
}

func (env *interactionEnv) handleDeliverMsgs(t *testing.T, d *datadriven.TestData) {
	var from, to int
	var typ string
	d.MaybeScanArgs(t, "from", &from)
	d.MaybeScanArgs(t, "to", &to)
	d.MaybeScanArgs(t, "type", &typ)
	match := func(m raftpb.Message) bool {
		return (from == 0 || m.From == env.nodes[from-1].id) &&
			(to == 0 || m.To == env.nodes[to-1].id) &&
			(typ == "" || m.Type.String() == typ)
	}
	env.trace = true
	var chosen, rest []raftpb.Message
	for _, m := range env.inflight {
		if match(m) {
			chosen = append(chosen, m)
		} else {
			rest = append(rest, m)
		}
	}
	env.inflight = rest
	for _, m := range chosen {
		env.deliver(m, d.HasArg("drop"))
	}
}

func (env *interactionEnv) handlePartition(t *testing.T, d *datadriven.TestData) {
	clear(env.sides)
	for _, en := range env.nodes {
		env.sides[en.id] = 0
	}
	for i := range d.CmdArgs {
		env.sides[env.nodeArg(t, d, i).id] = 1
	}
}

func (env *interactionEnv) handleDisk(t *testing.T, d *datadriven.TestData) {
	en := env.nodeArg(t, d, 0)
	switch op := env.stringArg(t, d, 1); op {
	case "hold":
		en.diskHeld = true
	case "release":
		en.diskHeld = false
	case "process":
		env.trace = true
		env.writeDisk(en)
	case "fail":
		en.diskFails = true
	default:
		d.Fatalf(t, "disk: unknown operation %q", op)
	}
}

func (env *interactionEnv) handleSlowDisk(t *testing.T, d *datadriven.TestData) {
	en := env.nodeArg(t, d, 0)
	delay, err := time.ParseDuration(env.stringArg(t, d, 1))
	if err != nil {
		d.Fatalf(t, "slow-disk: %v", err)
	}
	en.faults.SetDiskDelay(delay)
}

// handlePropose builds each put as Propose does and hands them to the
// loop as one batch, as its propose drains proposeC.
func (env *interactionEnv) handlePropose(t *testing.T, d *datadriven.TestData) {
	en := env.nodeArg(t, d, 0)
	var batch []proposal
	for _, arg := range d.CmdArgs[1:] {
		if arg.Key == "queued" && len(arg.Vals) == 0 {
			continue
		}
		if len(arg.Vals) != 1 {
			d.Fatalf(t, "propose: want KEY=VALUE, got %s", arg)
		}
		cmd := &lodestonepb.Command{
			Op:           &lodestonepb.Command_Put{Put: &lodestonepb.PutRequest{Key: []byte(arg.Key), Value: []byte(arg.Vals[0])}},
			TimeUnixNano: env.clock.Now().UnixNano(),
		}
		body, err := proto.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		id := en.n.nextID.Add(1)
		data := binary.BigEndian.AppendUint64(make([]byte, 0, 8+len(body)), id)
		batch = append(batch, proposal{id: id, data: append(data, body...)})
		label := env.nextLabel('p')
		env.printf("%s: put %s=%s on %s", label, arg.Key, arg.Vals[0], en.name)
		env.proposals = append(env.proposals, envProposal{label: label, node: en, ch: en.n.waits.register(id)})
	}
	if d.HasArg("queued") {
		// Propose has registered the waiters; the batch has not reached
		// the loop yet.
		en.queued = append(en.queued, batch...)
		return
	}
	env.submit(en, batch)
}

// handleProposeEach proposes COUNT puts on a node one at a time, settling
// after each, so each is an append of its own to every follower; the
// puts' outcomes and applies are not printed, only how many were applied
// on the proposer.
func (env *interactionEnv) handleProposeEach(t *testing.T, d *datadriven.TestData) error {
	ref := env.stringArg(t, d, 0)
	en := env.nodeByRef(t, d, ref)
	var count int
	d.ScanArgs(t, "count", &count)
	mark := env.out.Len()
	for i := range count {
		env.handlePropose(t, &datadriven.TestData{Cmd: "propose", CmdArgs: []datadriven.CmdArg{
			{Key: ref}, {Key: fmt.Sprintf("each%d", i), Vals: []string{"v"}}}})
		if err := env.settle(); err != nil {
			return err
		}
	}
	out := env.out.String()
	applied := strings.Count(out[mark:], ": applied at ") // each proposal's outcome, printed once
	env.out.Reset()
	env.out.WriteString(out[:mark])
	env.printf("%d puts proposed on %s one at a time, %d applied there", count, en.name, applied)
	return nil
}

// handleSubmit hands a node's queued proposals to its loop.
func (env *interactionEnv) handleSubmit(t *testing.T, d *datadriven.TestData) {
	en := env.nodeArg(t, d, 0)
	batch := en.queued
	en.queued = nil
	env.submit(en, batch)
}

func (env *interactionEnv) submit(en *envNode, batch []proposal) {
	env.step(en, func() error {
		for _, p := range batch {
			en.n.proposeOne(p)
		}
		return nil
	})
}

func (env *interactionEnv) handleReadIndex(t *testing.T, d *datadriven.TestData) {
	en := env.nodeArg(t, d, 0)
	label := env.nextLabel('r')
	env.printf("%s: read on %s", label, en.name)
	env.reads = append(env.reads, envRead{label: label, node: en, round: en.n.joinRead()})
	env.step(en, func() error { en.n.flushReads(); return nil })
}

// handleAddMember starts the joining node first, so that it is there to
// answer the leader, then proposes the change.
func (env *interactionEnv) handleAddMember(t *testing.T, d *datadriven.TestData) error {
	en := env.nodeArg(t, d, 0)
	var name string
	d.ScanArgs(t, "name", &name)
	typ := raftpb.ConfChangeAddNode
	if d.HasArg("learner") {
		typ = raftpb.ConfChangeAddLearnerNode
	}
	if _, ok := env.byID[member.ID(name)]; !ok {
		cluster := map[string]string{name: name + ":2380"}
		for _, other := range env.nodes {
			cluster[other.name] = other.name + ":2380"
		}
		if _, err := env.addNode(name, cluster, true); err != nil {
			return err
		}
	}
	mem := &lodestonepb.Member{Id: member.ID(name), Name: name, PeerAddr: name + ":2380"}
	cc := raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: typ, NodeID: mem.Id}}}
	env.changeConf(en, cc, mem, fmt.Sprintf("add %s (%s)", name, strings.TrimPrefix(typ.String(), "ConfChange")))
	return nil
}

func (env *interactionEnv) handleRemoveMember(t *testing.T, d *datadriven.TestData) {
	en := env.nodeArg(t, d, 0)
	name := env.stringArg(t, d, 1)
	cc := raftpb.ConfChangeV2{Changes: []raftpb.ConfChangeSingle{{Type: raftpb.ConfChangeRemoveNode, NodeID: member.ID(name)}}}
	env.changeConf(en, cc, nil, "remove "+name)
}

// changeConf does what ChangeConf does: a request id in the context, a
// waiter for it, and the loop's proposeConfChange, which may refuse.
func (env *interactionEnv) changeConf(en *envNode, cc raftpb.ConfChangeV2, mem *lodestonepb.Member, what string) {
	id := en.n.nextID.Add(1)
	cctx, err := proto.Marshal(&lodestonepb.ConfChangeContext{Member: mem, RequestId: id})
	if err != nil {
		env.t.Fatal(err)
	}
	cc.Context = cctx
	label := env.nextLabel('c')
	env.printf("%s: %s on %s", label, what, en.name)
	ch := en.n.waits.register(id)
	var refused error
	env.step(en, func() error {
		refused = en.n.proposeConfChange(confRequest{cc: cc, id: id})
		return nil
	})
	if refused != nil {
		en.n.waits.cancel(id)
		env.printf("%s: refused: %s", label, env.describeErr(refused))
		return
	}
	env.proposals = append(env.proposals, envProposal{label: label, node: en, ch: ch})
	env.reportAnswers()
}

func (env *interactionEnv) handleTransferLeader(t *testing.T, d *datadriven.TestData) {
	en := env.nodeArg(t, d, 0)
	var to uint64
	if len(d.CmdArgs) > 1 {
		to = env.nodeArg(t, d, 1).id
	}
	done := make(chan transferResult, 1)
	env.step(en, func() error { en.n.transfer(transferRequest{to: to, done: done}); return nil })
	if res := <-done; res.err != nil {
		env.printf("transfer refused: %s", env.describeErr(res.err))
	} else {
		env.printf("%s: transferring leadership to %s", en.name, env.name(res.to))
	}
}

func (env *interactionEnv) handleRaftState() {
	for _, en := range env.nodes {
		st := en.n.rn.BasicStatus()
		first, _ := en.log.FirstIndex()
		last, _ := en.log.LastIndex()
		line := fmt.Sprintf("%s: %s; commit=%d applied=%d log=%d..%d snapshot=%d %s",
			en.name, env.describeRole(env.view(en)), st.Commit, en.n.appliedIndex, first, last, en.n.snapIndex,
			env.describeConf(en.n.confState))
		if en.stopped != nil {
			line += " (stopped)"
		}
		env.printf("%s", line)
	}
}

// handleLogCache prints the entries each node's log holds in memory
// (releaseLog), and those the journal has yet to put into raft.db, which
// stay cached whatever is released.
func (env *interactionEnv) handleLogCache() {
	for _, en := range env.nodes {
		s := en.log.Stats()
		last, _ := en.log.LastIndex()
		line := fmt.Sprintf("%s: no entry cached", en.name)
		if s.CachedEntries > 0 {
			line = fmt.Sprintf("%s: entries %s cached", en.name, span(last-uint64(s.CachedEntries)+1, last))
		}
		env.printf("%s (log ends at %d)", line, last)
	}
}

// handleStatus prints a leader's progress for every other member, with
// raft's view of whether it is active next to the loop's (PeerActive).
func (env *interactionEnv) handleStatus(t *testing.T, d *datadriven.TestData) {
	en := env.nodeArg(t, d, 0)
	st := en.n.rn.Status()
	if st.RaftState != raft.StateLeader {
		env.printf("%s: %s; no progress to show", en.name, env.describeRole(env.view(en)))
		return
	}
	var lines []string
	for id, pr := range st.Progress {
		if id == en.id {
			continue
		}
		line := fmt.Sprintf("%s: match=%d next=%d %s", env.name(id), pr.Match, pr.Next, pr.State)
		if pr.IsLearner {
			line += " learner"
		}
		if n := pr.Inflights.Count(); n > 0 {
			line += fmt.Sprintf(" inflight=%d", n)
		}
		line += fmt.Sprintf(" recent-active=%t peer-active=%t", pr.RecentActive, en.n.PeerActive(id))
		lines = append(lines, line)
	}
	sort.Strings(lines)
	env.printf("%s: leader at term %d, commit %d", en.name, st.Term, st.Commit)
	for _, l := range lines {
		env.printf("  %s", l)
	}
}

// handleLearners prints the learner view N publishes (Learners).
func (env *interactionEnv) handleLearners(t *testing.T, d *datadriven.TestData) {
	en := env.nodeArg(t, d, 0)
	l := en.n.Learners()
	if len(l.Progress) == 0 {
		env.printf("%s: no learners published", en.name)
		return
	}
	env.printf("%s: last=%d", en.name, l.LastIndex)
	for _, p := range l.Progress {
		env.printf("  %s: match=%d recent-active=%t", env.name(p.ID), p.Match, p.RecentActive)
	}
}

func (env *interactionEnv) handleGet(t *testing.T, d *datadriven.TestData) {
	key := env.stringArg(t, d, 0)
	for _, en := range env.nodes {
		kv, index := en.n.store.Get([]byte(key))
		if kv == nil {
			env.printf("%s: %s not found (store at %d)", en.name, key, index)
			continue
		}
		env.printf("%s: %s=%s (modified at %d)", en.name, key, kv.Value, kv.ModifyIndex)
	}
}

func (env *interactionEnv) handleLogLevel(t *testing.T, d *datadriven.TestData) {
	levels := map[string]slog.Level{
		"debug": slog.LevelDebug, "info": slog.LevelInfo, "warn": slog.LevelWarn,
		"error": slog.LevelError, "none": slog.LevelError + 100,
	}
	lvl, ok := levels[env.stringArg(t, d, 0)]
	if !ok {
		d.Fatalf(t, "log-level: unknown level %q", env.stringArg(t, d, 0))
	}
	env.logLevel.Set(lvl)
}

// --- arguments ----------------------------------------------------------------------

// stringArg is the i-th argument as written.
func (env *interactionEnv) stringArg(t *testing.T, d *datadriven.TestData, i int) string {
	if i >= len(d.CmdArgs) {
		d.Fatalf(t, "%s: want at least %d arguments", d.Cmd, i+1)
	}
	return d.CmdArgs[i].Key
}

func (env *interactionEnv) intArg(t *testing.T, d *datadriven.TestData, i int) int {
	v, err := strconv.Atoi(env.stringArg(t, d, i))
	if err != nil {
		d.Fatalf(t, "%s: argument %d: %v", d.Cmd, i+1, err)
	}
	return v
}

// nodeArg is the node the i-th argument names, by number (1) or name (n1).
func (env *interactionEnv) nodeArg(t *testing.T, d *datadriven.TestData, i int) *envNode {
	return env.nodeByRef(t, d, env.stringArg(t, d, i))
}

func (env *interactionEnv) nodeByRef(t *testing.T, d *datadriven.TestData, ref string) *envNode {
	if en, ok := env.byID[member.ID(ref)]; ok {
		return en
	}
	if i, err := strconv.Atoi(ref); err == nil && i >= 1 && i <= len(env.nodes) {
		return env.nodes[i-1]
	}
	d.Fatalf(t, "%s: no node %q", d.Cmd, ref)
	return nil
}

// nodesArg is the nodes listed in key=(1,2), or every node.
func (env *interactionEnv) nodesArg(t *testing.T, d *datadriven.TestData, key string) []*envNode {
	arg, ok := d.Arg(key)
	if !ok {
		return env.nodes
	}
	var nodes []*envNode
	for _, v := range arg.Vals {
		nodes = append(nodes, env.nodeByRef(t, d, v))
	}
	return nodes
}

func (env *interactionEnv) durationArg(t *testing.T, d *datadriven.TestData, key string, def time.Duration) time.Duration {
	var s string
	if !d.MaybeScanArgs(t, key, &s) {
		return def
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		d.Fatalf(t, "%s: %s: %v", d.Cmd, key, err)
	}
	return v
}
