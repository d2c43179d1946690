package main

import (
	"os"
	"path/filepath"
	"testing"
)

// TestOpsUsageErrors: the snapshot, recover and admission commands refuse
// a wrong command line with one line naming what is wrong, exit 2, and
// change nothing.
func TestOpsUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"save without file", []string{"snapshot", "save"}, "want FILE"},
		{"restore without data dir", []string{"snapshot", "restore", "x.snap", "--name", "n1", "--initial-cluster", "n1=127.0.0.1:1"}, "--data-dir is required"},
		{"restore without name", []string{"snapshot", "restore", "x.snap", "--data-dir", "d", "--initial-cluster", "n1=127.0.0.1:1"}, "--name is required"},
		{"restore bad cluster", []string{"snapshot", "restore", "x.snap", "--data-dir", "d", "--name", "n1", "--initial-cluster", "n1"}, "not name=host:port"},
		{"recover without data dir", []string{"recover", "--name", "n1"}, "--data-dir is required"},
		{"recover without name", []string{"recover", "--data-dir", "d"}, "--name is required"},
		{"admission set nothing", []string{"admission", "set"}, "give at least one of --reads"},
		{"admission bad ramp", []string{"admission", "set", "--writes", "5", "--ramp", "fast"}, `--ramp "fast"`},
		{"admission ramp over 100", []string{"admission", "set", "--writes", "5", "--ramp", "150/min"}, "PERCENT in (0, 100]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cli(t, nil, "", tc.args...).failed(t, 2, tc.want, "--help")
		})
	}
}

// TestOpsRefusals: damaged files and missing data are refused with exit 1
// and a line naming the problem.
func TestOpsRefusals(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	junk := filepath.Join(dir, "junk.snap")
	if err := os.WriteFile(junk, []byte("LDSTBKUP\x00\x00"), 0o644); err != nil {
		t.Fatal(err)
	}
	cli(t, nil, "", "snapshot", "inspect", junk).failed(t, 1, "damaged", "truncated")
	cli(t, nil, "", "snapshot", "inspect", filepath.Join(dir, "missing.snap")).failed(t, 1, "no such file")
	target := filepath.Join(dir, "new")
	cli(t, nil, "", "snapshot", "restore", junk, "--data-dir", target, "--name", "n1", "--initial-cluster", "n1=127.0.0.1:1").failed(t, 1, "damaged")
	if _, err := os.Stat(target); !os.IsNotExist(err) {
		t.Errorf("a refused restore created %s", target)
	}
	cli(t, nil, "", "recover", "--data-dir", filepath.Join(dir, "empty"), "--name", "n1").failed(t, 1, "holds no raft log")
}
