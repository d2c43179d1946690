package harness

import (
	"os"
	"testing"
	"time"
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

// CPUTime counts in clock ticks (10ms), so the test burns CPU until a
// tick shows, and fails only if 2s of spinning never shows one.
func TestCPUTime(t *testing.T) {
	start := time.Now()
	x := 0
	for {
		for i := range 1_000_000 {
			x += i
		}
		d, err := CPUTime(os.Getpid())
		if err != nil {
			t.Fatalf("CPUTime(self): %v", err)
		}
		if d > 0 {
			return
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("CPUTime(self) = %v after 2s of spinning (x=%d)", d, x)
		}
	}
}
