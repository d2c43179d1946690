package raftnode

import (
	"encoding/binary"
	"testing"

	"github.com/cockroachdb/datadriven"
	"go.etcd.io/raft/v3/raftpb"
)

// A confirmed round's reads wake before the next round goes out, and the
// loop yields between the two: a read that a woken one starts then (its
// client's next) joins that round instead of waiting for a third. Sent at
// once, as before, a round held only the reads of one round trip.
func TestReadsWokenBeforeTheNextRoundJoinIt(t *testing.T) {
	env := newInteractionEnv(t)
	for _, line := range []string{"add-nodes 3", "campaign 1", "stabilize quiet"} {
		runLine(t, env, line)
	}
	leader := env.nodes[0]
	read := func() *readRound {
		r := leader.n.joinRead()
		env.step(leader, func() error { leader.n.flushReads(); return nil })
		return r
	}
	first, second := read(), read()
	if first == second {
		t.Fatal("a read that arrived while a round was out joined that round")
	}
	var yields int
	var third *readRound
	leader.n.yield = func() {
		yields++
		select {
		case <-first.done:
		default:
			t.Error("the loop yielded before waking the confirmed round's reads")
		}
		if third == nil {
			third = leader.n.joinRead()
		}
	}
	rounds := map[uint64]bool{}
	env.onSend = func(from *envNode, m raftpb.Message) {
		if from == leader && m.Type == raftpb.MsgHeartbeat && len(m.Context) == 16 {
			rounds[binary.BigEndian.Uint64(m.Context[8:])] = true
		}
	}
	runLine(t, env, "stabilize")
	if third != second {
		t.Fatal("a read started during the yield did not join the waiting round")
	}
	if len(rounds) != 1 || yields == 0 {
		t.Fatalf("read rounds sent after the first: %v, yields %d; want one round (the second), yields at least 1", rounds, yields)
	}
	for i, r := range []*readRound{first, second} {
		select {
		case <-r.done:
		default:
			t.Fatalf("round %d: its reads were never answered", i+1)
		}
		if r.err != nil || r.index == 0 {
			t.Fatalf("round %d: index %d, err %v; want an index", i+1, r.index, r.err)
		}
	}
	if second.reads != 2 || second.index < first.index {
		t.Fatalf("second round: %d reads at index %d (first at %d); want 2 at an index no lower", second.reads, second.index, first.index)
	}
}

// Reads that arrive while a round is out share the next one, however many
// they are, and each gets the round's index.
func TestReadsShareTheNextRound(t *testing.T) {
	env := newInteractionEnv(t)
	for _, line := range []string{"add-nodes 3", "campaign 1", "stabilize quiet"} {
		runLine(t, env, line)
	}
	leader := env.nodes[0]
	first := leader.n.joinRead()
	env.step(leader, func() error { leader.n.flushReads(); return nil })
	var waiting []*readRound
	for range 100 {
		waiting = append(waiting, leader.n.joinRead())
		env.step(leader, func() error { leader.n.flushReads(); return nil })
	}
	var rounds int
	env.onSend = func(from *envNode, m raftpb.Message) {
		if from == leader && m.Type == raftpb.MsgHeartbeat && len(m.Context) == 16 {
			rounds++
		}
	}
	runLine(t, env, "stabilize")
	if rounds != 2 { // one heartbeat to each follower
		t.Fatalf("%d read heartbeats sent for 100 reads that waited together; want 2 (one round)", rounds)
	}
	if first.err != nil || first.index == 0 {
		t.Fatalf("first round: index %d, err %v", first.index, first.err)
	}
	for i, r := range waiting {
		if r != waiting[0] {
			t.Fatalf("read %d joined another round than the first waiting read", i)
		}
	}
	select {
	case <-waiting[0].done:
	default:
		t.Fatal("the waiting reads were never answered")
	}
	if r := waiting[0]; r.err != nil || r.index < first.index || r.reads != 100 {
		t.Fatalf("waiting round: index %d (first %d), %d reads, err %v; want 100 reads at an index no lower", r.index, first.index, r.reads, r.err)
	}
}

// runLine runs one script command of the interaction tests.
func runLine(t *testing.T, env *interactionEnv, line string) {
	t.Helper()
	cmd, args, err := datadriven.ParseLine(line)
	if err != nil {
		t.Fatal(err)
	}
	out := env.handle(t, &datadriven.TestData{Cmd: cmd, CmdArgs: args})
	t.Logf("%s\n%s", line, out)
}
