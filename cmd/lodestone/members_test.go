package main

import (
	"bytes"
	"encoding/json"
	"net"
	"strings"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client/clienttest"
)

func TestMembersFlow(t *testing.T) {
	t.Parallel()
	_, env := startMemory(t)
	// n2 is never started: its gRPC address refuses connections, so calls
	// that prefer it once it leads move on to n1.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n2GRPC := l.Addr().String()
	_ = l.Close()
	add := cli(t, env, "", "members", "add", "n2", "--peer", "10.0.0.2:7401", "--grpc", n2GRPC, "--http", "10.0.0.2:8500", "--learner").ok(t)
	for _, want := range []string{"added learner n2", "--join", "--initial-cluster n1=127.0.0.1:7401,n2=10.0.0.2:7401"} {
		if !strings.Contains(add.stdout, want) {
			t.Errorf("members add printed %q, want it to contain %q", add.stdout, want)
		}
	}

	var ms []jsonMember
	if err := json.Unmarshal([]byte(cli(t, env, "", "members", "-o", "json").ok(t).stdout), &ms); err != nil {
		t.Fatal(err)
	}
	if len(ms) != 2 || ms[0].Name != "n1" || !ms[0].Leader || ms[1].Role != "learner" {
		t.Fatalf("members -o json = %+v, want leader n1 and learner n2", ms)
	}

	// By hex id, as the table shows it.
	if got := cli(t, env, "", "members", "promote", ms[1].ID).ok(t).stdout; !strings.HasPrefix(got, "promoted n2") {
		t.Errorf("members promote printed %q", got)
	}
	cli(t, env, "", "members", "promote", "n2").failed(t, 1, "already a voter")
	if got := cli(t, env, "", "members", "transfer-leader", "--to", "n2").ok(t).stdout; !strings.HasPrefix(got, "leader is now n2") {
		t.Errorf("members transfer-leader printed %q", got)
	}
	cli(t, env, "", "members", "remove", "n9").failed(t, 1, `"n9"`, "members: n1, n2", "lodestone members")
	// Two voters: removing one leaves a single voter, which needs --force.
	cli(t, env, "", "members", "remove", "n1").failed(t, 1, `refused to remove voter "n1"`, "only voter", "--force")
	if got := cli(t, env, "", "members", "remove", "n1", "--force").ok(t).stdout; !strings.HasPrefix(got, "removed n1") {
		t.Errorf("members remove printed %q", got)
	}
	table := cli(t, env, "", "members").ok(t).stdout
	if strings.Contains(table, "n1") || !strings.Contains(table, "voter  *") {
		t.Errorf("members after remove:\n%s", table)
	}
}

// members add: a learner promoted automatically by default, --voter-now
// refused for an address nobody answers, the two exclusive flags refused.
func TestMembersAddFlags(t *testing.T) {
	t.Parallel()
	_, env := startMemory(t)
	dead := func() string {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return l.Addr().String()
	}()
	cli(t, env, "", "members", "add", "evil", "--peer", dead, "--voter-now").failed(t, 1, `refused to add "evil" as a voter now`, dead, "does not answer")
	cli(t, env, "", "members", "add", "evil", "--peer", dead, "--voter-now", "--learner").failed(t, 2, "--learner and --voter-now exclude each other")

	add := cli(t, env, "", "members", "add", "evil", "--peer", dead).ok(t).stdout
	for _, want := range []string{"added learner evil", "the leader makes it a voter once it has caught up"} {
		if !strings.Contains(add, want) {
			t.Errorf("members add printed %q, want it to contain %q", add, want)
		}
	}
	if table := cli(t, env, "", "members").ok(t).stdout; !strings.Contains(table, "learner (auto-promote)") {
		t.Errorf("members table does not show the learner awaiting promotion:\n%s", table)
	}
	var ms []jsonMember
	if err := json.Unmarshal([]byte(cli(t, env, "", "members", "-o", "json").ok(t).stdout), &ms); err != nil {
		t.Fatal(err)
	}
	for _, m := range ms {
		if m.Name == "evil" && (m.Role != "learner" || !m.AutoPromote) {
			t.Errorf("members -o json lists evil as %+v, want a learner with auto_promote", m)
		}
	}

	// A peer port that answers: the voter is added at once.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if got := cli(t, env, "", "members", "add", "n3", "--peer", l.Addr().String(), "--voter-now").ok(t).stdout; !strings.HasPrefix(got, "added voter n3") {
		t.Errorf("members add --voter-now printed %q", got)
	}
}

func TestResolveMember(t *testing.T) {
	t.Parallel()
	ms := []*lodestonepb.Member{
		{Id: 0xabc, Name: "n1"},
		{Id: 0x10, Name: "ff"}, // a name that is also hex
		{Id: 0xff, Name: "n3"},
		{Id: 12, Name: "n4"},
	}
	for _, tc := range []struct {
		arg, want string
	}{
		{"n1", "n1"},
		{"abc", "n1"},
		{"0xABC", "n1"},
		{"ff", "ff"}, // names win over ids
		{"0xff", "n3"},
		{"c", "n4"},
		{"12", "n4"}, // hex 0x12 matches nobody, decimal 12 does
	} {
		m, err := resolveMember(ms, tc.arg)
		if err != nil || m.GetName() != tc.want {
			t.Errorf("resolveMember(%q) = %v, %v; want %s", tc.arg, m.GetName(), err, tc.want)
		}
	}
	if _, err := resolveMember(ms, "zz"); err == nil {
		t.Error("resolveMember(zz) succeeded, want an error")
	}
}

func membersFixture() []*lodestonepb.Member {
	return []*lodestonepb.Member{
		{Id: clienttest.MemberID("n3"), Name: "n3", PeerAddr: "10.0.0.3:7401", GrpcAddr: "10.0.0.3:7400", HttpAddr: "10.0.0.3:8500", Learner: true},
		{Id: clienttest.MemberID("n1"), Name: "n1", PeerAddr: "10.0.0.1:7401", GrpcAddr: "10.0.0.1:7400", HttpAddr: "10.0.0.1:8500"},
		{Id: clienttest.MemberID("n2"), Name: "n2", PeerAddr: "10.0.0.2:7401", GrpcAddr: "10.0.0.2:7400"},
	}
}

func TestRenderMembersGolden(t *testing.T) {
	t.Parallel()
	ms := membersFixture()
	leader := clienttest.MemberID("n2")
	added := &lodestonepb.AddMemberResponse{Header: &lodestonepb.ResponseHeader{LeaderId: leader}, Member: ms[0], Members: ms}
	for _, tc := range []struct {
		command, name string
		render        func(*bytes.Buffer) error
	}{
		{"members", "table", func(b *bytes.Buffer) error { return renderMembers(b, outputTable, ms, leader) }},
		{"members", "table-no-leader", func(b *bytes.Buffer) error { return renderMembers(b, outputTable, ms, 0) }},
		{"members", "json", func(b *bytes.Buffer) error { return renderMembers(b, outputJSON, ms, leader) }},
		{"members-add", "table", func(b *bytes.Buffer) error { return renderMembersAdd(b, outputTable, added) }},
		{"members-add", "json", func(b *bytes.Buffer) error { return renderMembersAdd(b, outputJSON, added) }},
		{"members-remove", "table", func(b *bytes.Buffer) error {
			return renderMemberChange(b, outputTable, "removed", ms[0], ms[1:], leader)
		}},
		{"members-remove", "json", func(b *bytes.Buffer) error {
			return renderMemberChange(b, outputJSON, "removed", ms[0], ms[1:], leader)
		}},
		{"members-promote", "table", func(b *bytes.Buffer) error {
			return renderMemberChange(b, outputTable, "promoted", ms[0], ms, leader)
		}},
		{"members-transfer-leader", "table", func(b *bytes.Buffer) error { return renderTransferLeader(b, outputTable, ms[1], 7) }},
		{"members-transfer-leader", "json", func(b *bytes.Buffer) error { return renderTransferLeader(b, outputJSON, ms[1], 7) }},
	} {
		t.Run(tc.command+"/"+tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.render(&b); err != nil {
				t.Fatal(err)
			}
			golden(t, tc.command, tc.name, b.Bytes())
		})
	}
}
