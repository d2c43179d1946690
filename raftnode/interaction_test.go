package raftnode

import (
	"testing"

	"github.com/cockroachdb/datadriven"
)

// TestInteraction runs the scripts in testdata/ against Nodes driven by an
// interactionEnv (interaction_env_test.go): several nodes in this
// goroutine, a fake clock, a network and disks the script controls, no
// sockets, no sleeps, no goroutines of the loop's. Every run of a script
// prints the same. Rerun with -rewrite to regenerate, and commit the diff
// only if you can explain it.
//
// Nodes are named n1, n2, ... in the order they are added; commands take
// them by number. A command prints what it changed (see interactionEnv);
// one that changed nothing prints "ok".
//
//	add-nodes N [election=10] [heartbeat=1] [tick=100ms]
//	          [snapshot-entries=1000] [snapshot-bytes=0] [catch-up=100]
//	          [slow-threshold=0] [slow-window=10s] [slow-cooldown=5m]
//	          [leader-change-wait=0]
//	    Bootstrap a cluster of N voters. The settings hold for every node
//	    of the script, joiners too.
//	campaign N
//	    Tick N alone until it starts an election (see campaign); messages
//	    stay in flight.
//	tick T [nodes=(N,...)] [trace]
//	    T times: move the clock one tick, tick the nodes (default all),
//	    settle quietly (trace: print messages and writes).
//	stabilize [quiet]
//	    Settle: deliver every message, write every disk that is not held,
//	    run every snapshot job, until nothing is left; prints messages and
//	    log writes unless quiet.
//	deliver-msgs [from=N] [to=N] [type=MsgApp] [drop]
//	    Deliver (or drop) the matching messages in flight, in order; the
//	    rest stay in flight, so later deliveries reorder them.
//	partition N [N...] | heal
//	    Cut the listed nodes off from the others / restore every link.
//	disk N hold|release|process|fail
//	    hold: log writes stay queued; release: settles write them again;
//	    process: write what is queued now, held or not; fail: the journal's
//	    writes fail from now on, and the first log write they fail stops
//	    the node's loop.
//	slow-disk N DURATION
//	    Every log write with entries on N takes DURATION (Faults).
//	restart N
//	    Crash N (log writes still queued are lost) and start it again
//	    from its directory with a new store: it restores the newest
//	    snapshot and replays its log.
//	propose N KEY=VALUE... [queued]
//	    Propose a put per pair on N in one batch; prints their labels (p1,
//	    ...), and later each one's outcome. With queued, the waiters are
//	    registered but the batch stays on its way to the loop (proposeC)
//	    until submit N.
//	propose-each N count=C
//	    Propose C puts on N one at a time, settling after each (one append
//	    each); prints how many N applied, not each outcome.
//	submit N
//	    Hand N's queued proposals to its loop.
//	read-index N
//	    Start a linearizable read on N (r1, ...).
//	add-member N name=NAME [learner]
//	    Start a node NAME joining with an empty log, and propose adding
//	    (or promoting) it on N (c1, ...).
//	remove-member N NAME
//	    Propose removing NAME on N.
//	transfer-leader N [TO]
//	    Ask N to hand leadership to TO (default: the loop's choice).
//	raft-state
//	    Per node: role, term, commit, applied, durable log, snapshot, voters.
//	status N
//	    N's view of its followers' progress (a leader's).
//	learners N
//	    The learner view N publishes (Learners), for auto-promotion.
//	get KEY
//	    KEY in every node's store.
//	log-level none|error|warn|info|debug
//	    The nodes' log lines printed (default warn).
func TestInteraction(t *testing.T) {
	datadriven.Walk(t, "testdata", func(t *testing.T, path string) {
		env := newInteractionEnv(t)
		datadriven.RunTest(t, path, env.handle)
	})
}

// handle runs one command and returns what it printed.
func (env *interactionEnv) handle(t *testing.T, d *datadriven.TestData) string {
	env.t = t
	env.out.Reset()
	env.trace = false
	var err error
	switch d.Cmd {
	case "add-nodes":
		err = env.handleAddNodes(t, d)
	case "campaign":
		err = env.campaign(env.nodeArg(t, d, 0))
	case "tick":
		err = env.handleTick(t, d)
	case "stabilize":
		env.trace = !d.HasArg("quiet")
		err = env.settle()
	case "deliver-msgs":
		env.handleDeliverMsgs(t, d)
	case "partition":
		env.handlePartition(t, d)
	case "heal":
		clear(env.sides)
	case "disk":
		env.handleDisk(t, d)
	case "slow-disk":
		env.handleSlowDisk(t, d)
	case "restart":
		err = env.restart(env.nodeArg(t, d, 0))
	case "propose":
		env.handlePropose(t, d)
	case "propose-each":
		err = env.handleProposeEach(t, d)
	case "submit":
		env.handleSubmit(t, d)
	case "read-index":
		env.handleReadIndex(t, d)
	case "add-member":
		err = env.handleAddMember(t, d)
	case "remove-member":
		env.handleRemoveMember(t, d)
	case "transfer-leader":
		env.handleTransferLeader(t, d)
	case "raft-state":
		env.handleRaftState()
	case "log-cache":
		env.handleLogCache()
	case "status":
		env.handleStatus(t, d)
	case "learners":
		env.handleLearners(t, d)
	case "get":
		env.handleGet(t, d)
	case "log-level":
		env.handleLogLevel(t, d)
	default:
		d.Fatalf(t, "unknown command %q", d.Cmd)
	}
	if err != nil {
		env.printf("error: %s", env.describeErr(err))
	}
	if env.out.Len() == 0 {
		return "ok\n"
	}
	return env.out.String()
}
