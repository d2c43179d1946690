package main

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client/clienttest"
)

func TestStatusCLI(t *testing.T) {
	t.Parallel()
	s, env := startMemory(t)
	out := cli(t, env, "", "status").ok(t).stdout
	for _, want := range []string{"ENDPOINT", s.Addr, "n1", "leader", "32 KiB"} {
		if !strings.Contains(out, want) {
			t.Errorf("status printed %q, want it to contain %q", out, want)
		}
	}

	// One of two endpoints is down: both rows, and a non-zero exit.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := l.Addr().String()
	_ = l.Close()
	r := cli(t, nil, "", "--endpoints", s.Addr+","+down, "status")
	r.failed(t, 1, "1 of 2 servers did not answer", down)
	if !strings.Contains(r.stdout, s.Addr) || !strings.Contains(r.stdout, down) || !strings.Contains(r.stdout, "ERROR") {
		t.Errorf("status printed %q, want a row per endpoint and an ERROR column", r.stdout)
	}
}

func statusFixture() []endpointStatus {
	n1, n2 := clienttest.MemberID("n1"), clienttest.MemberID("n2")
	st := func(self *lodestonepb.Member, state string, commit, applied uint64, log *lodestonepb.LogStats) *lodestonepb.StatusResponse {
		return &lodestonepb.StatusResponse{
			Self: self, LeaderId: n1, LeaderName: "n1", Term: 4, CommitIndex: commit, AppliedIndex: applied,
			RaftState: state, Log: log, Version: "0.1.0",
		}
	}
	return []endpointStatus{
		{Endpoint: "10.0.0.1:7400", Status: st(&lodestonepb.Member{Id: n1, Name: "n1"}, "StateLeader", 1200, 1200, &lodestonepb.LogStats{
			FirstIndex: 1001, LastIndex: 1200, FileBytes: 8 << 20, FreePages: 1900, PendingPages: 3, FreeBytes: 1900 * 4096, FreelistBytes: 15200, SnapshotIndex: 1000,
		})},
		{Endpoint: "10.0.0.2:7400", Status: st(&lodestonepb.Member{Id: n2, Name: "n2"}, "StateFollower", 1200, 1198, &lodestonepb.LogStats{
			FirstIndex: 1001, LastIndex: 1200, FileBytes: 1536, FreePages: 0, FreelistBytes: 0, SnapshotIndex: 1000,
		})},
	}
}

func TestRenderStatusGolden(t *testing.T) {
	t.Parallel()
	ok := statusFixture()
	partial := append(statusFixture(), endpointStatus{Endpoint: "10.0.0.3:7400",
		Err: errors.New(`client: status via 10.0.0.3:7400: unavailable: connection refused`)})
	for _, tc := range []struct {
		name string
		in   []endpointStatus
		fmt  string
	}{
		{"table", ok, outputTable},
		{"json", ok, outputJSON},
		{"table-partial-failure", partial, outputTable},
		{"json-partial-failure", partial, outputJSON},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := renderStatus(&b, tc.fmt, tc.in); err != nil {
				t.Fatal(err)
			}
			golden(t, "status", tc.name, b.Bytes())
		})
	}
}

func TestHumanBytes(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		n    uint64
		want string
	}{
		{0, "0 B"}, {1023, "1023 B"}, {1024, "1 KiB"}, {1536, "1.5 KiB"}, {32768, "32 KiB"},
		{7_800_000, "7.4 MiB"}, {8 << 20, "8 MiB"}, {150 << 30, "150 GiB"}, {1 << 62, "4 EiB"},
	} {
		if got := humanBytes(tc.n); got != tc.want {
			t.Errorf("humanBytes(%d) = %q, want %q", tc.n, got, tc.want)
		}
	}
}
