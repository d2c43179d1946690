package cpuset

import (
	"os"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	for in, want := range map[string]int{"0": 1, "0,1": 2, "0-3": 4, "1, 3-4": 3} {
		set, err := Parse(in)
		if err != nil || set.Count() != want {
			t.Errorf("Parse(%q) = %d CPUs, %v; want %d", in, set.Count(), err, want)
		}
	}
	set, _ := Parse("0,2-3")
	if !set.IsSet(0) || set.IsSet(1) || !set.IsSet(2) || !set.IsSet(3) {
		t.Errorf(`Parse("0,2-3") = %v, want CPUs 0, 2 and 3`, set)
	}
	for _, bad := range []string{"", "a", "3-1", "-1"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded", bad)
		}
	}
}

// PinSelf moves every thread of this process, not only the calling one.
func TestPinSelf(t *testing.T) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Skip("no /proc here")
	}
	var allowed string
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "Cpus_allowed_list:\t"); ok {
			allowed = v
		}
	}
	// Pin to what the process may use already, so the test leaves it as
	// it found it; the check is that every thread's list is that one.
	if err := PinSelf(allowed); err != nil {
		t.Fatalf("PinSelf(%q): %v", allowed, err)
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	for _, task := range tasks {
		b, err := os.ReadFile("/proc/self/task/" + task.Name() + "/status")
		if err != nil {
			continue // the thread ended
		}
		if !strings.Contains(string(b), "Cpus_allowed_list:\t"+allowed+"\n") {
			t.Errorf("thread %s after PinSelf(%q):\n%s", task.Name(), allowed, b)
		}
	}
	if err := PinSelf("x"); err == nil {
		t.Error(`PinSelf("x") succeeded`)
	}
}
