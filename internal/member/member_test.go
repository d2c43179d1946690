package member

import "testing"

func TestParseAndFormatCluster(t *testing.T) {
	m, err := ParseCluster(" b=127.0.0.1:2, a=127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := FormatCluster(m), "a=127.0.0.1:1,b=127.0.0.1:2"; got != want {
		t.Fatalf("FormatCluster = %q, want %q", got, want)
	}
	for _, bad := range []string{"a", "a=", "=x:1", "a=x:1,a=y:2"} {
		if _, err := ParseCluster(bad); err == nil {
			t.Errorf("ParseCluster(%q) accepted", bad)
		}
	}
	if m, err := ParseCluster("  "); err != nil || len(m) != 0 {
		t.Fatalf("empty: %v %v", m, err)
	}
}

func TestIDIsStableAndNonZero(t *testing.T) {
	if ID("n1") == 0 || ID("n1") != ID("n1") || ID("n1") == ID("n2") {
		t.Fatalf("ID: n1=%x n2=%x", ID("n1"), ID("n2"))
	}
	// The id is part of the wire and on-disk contract: a change would
	// make restarted members strangers to their own logs.
	if got := ID("n1"); got != 0x8b37b07b558d4c0 {
		t.Fatalf("ID(n1) = %x", got)
	}
}
