package main

import (
	"bytes"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/tools/snapshot"
)

// TestSnapshotInspectGolden pins what `snapshot inspect` prints, as a table
// and as JSON.
func TestSnapshotInspectGolden(t *testing.T) {
	in := snapshot.Info{
		Path: "backup.snap", Index: 27, Term: 2, Source: "n1",
		Members: []snapshot.Member{
			{ID: "8b37b07b558d4c0", Name: "n1", PeerAddr: "10.0.0.1:7401", Role: "voter"},
			{ID: "8b37d07b558d826", Name: "n2", PeerAddr: "10.0.0.2:7401", Role: "learner"},
		},
		Keys: 20, Nodes: 3, Services: 7, ServiceNames: 2, Sessions: 1,
		FileBytes: 1229, DataBytes: 1130, SHA256: "9c1e",
	}
	for _, format := range []string{outputTable, outputJSON} {
		var out bytes.Buffer
		if err := renderSnapshotInfo(&out, format, in); err != nil {
			t.Fatal(err)
		}
		golden(t, "snapshot-inspect", format, out.Bytes())
	}
}

// TestAdmissionDescribe pins the one-line policy descriptions.
func TestAdmissionDescribe(t *testing.T) {
	for _, tc := range []struct {
		p       *lodestonepb.AdmissionPolicy
		current float64
		want    string
	}{
		{&lodestonepb.AdmissionPolicy{}, -1, "admission control is off"},
		{&lodestonepb.AdmissionPolicy{Enabled: true, Writes: 500}, -1, "admission control is on: reads unlimited, writes 500/s, watches unlimited per server"},
		{&lodestonepb.AdmissionPolicy{Enabled: true, Reads: 2000, Writes: 500, Watches: 200, RampPercentPerMin: 10}, 30, "admission control is on: reads 2000/s, writes 500/s, watches 200/s per server, ramping 10%/min (now at 30%)"},
		{&lodestonepb.AdmissionPolicy{Enabled: true, Connections: 400, RampPercentPerMin: 25}, -1, "admission control is on: reads unlimited, writes unlimited, watches unlimited, new connections 400/s per server, ramping 25%/min"},
	} {
		if got := describePolicy(tc.p, tc.current); got != tc.want {
			t.Errorf("describePolicy = %q, want %q", got, tc.want)
		}
	}
}
