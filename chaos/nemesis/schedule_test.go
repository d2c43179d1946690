package nemesis

import (
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The promise for `make chaos`: every fault kind is injected at
// least 20 times, and the plan fits the campaign's duration.
func TestPlanInjectsEveryKindAndFitsTheDuration(t *testing.T) {
	total := 10 * time.Minute
	steps := Plan(AllKinds, 22, total, 42)
	counts := map[string]int{}
	var sum time.Duration
	for _, s := range steps {
		counts[s.Kind]++
		sum += s.Hold + s.Settle
		if s.Hold <= 0 || s.Settle <= 0 {
			t.Fatalf("step %+v has no hold or settle", s)
		}
	}
	for _, k := range AllKinds {
		if got, want := counts[k], 22; got != want {
			t.Errorf("%s planned %d times, want %d", k, got, want)
		}
	}
	if sum < total*9/10 || sum > total*11/10 {
		t.Errorf("plan lasts %v, want about %v", sum, total)
	}
	again := Plan(AllKinds, 22, total, 42)
	for i := range steps {
		if steps[i] != again[i] {
			t.Fatalf("plan is not a function of its seed: step %d %+v then %+v", i, steps[i], again[i])
		}
	}
}

func TestParseKinds(t *testing.T) {
	if got, err := ParseKinds("all"); err != nil || len(got) != len(AllKinds) {
		t.Errorf("ParseKinds(all) = %v, %v", got, err)
	}
	if _, err := ParseKinds("kill,meteor"); err == nil {
		t.Error("ParseKinds accepted an unknown kind")
	}
}
