package harness

import (
	"os"
	"testing"
)

func TestParseCPUs(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0,1": 2, "0-3": 4, "1, 3-4": 3} {
		set, err := ParseCPUs(in)
		if err != nil || set.Count() != want {
			t.Errorf("ParseCPUs(%q) = %d CPUs, %v; want %d", in, set.Count(), err, want)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "-1"} {
		if _, err := ParseCPUs(bad); err == nil {
			t.Errorf("ParseCPUs(%q) succeeded", bad)
		}
	}
}

func TestCPUTime(t *testing.T) {
	x := 0
	for i := range 20_000_000 {
		x += i
	}
	d, err := CPUTime(os.Getpid())
	if err != nil || d <= 0 {
		t.Fatalf("CPUTime(self) = %v, %v (x=%d)", d, err, x)
	}
}
