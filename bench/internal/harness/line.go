package harness

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// Line is one comparison in the format bench/README.md ("How benchmarks
// report") fixes:
//
//	BENCH <name> lodestone=<value><unit> <peer>=<value><unit> ratio=<lodestone/peer> target=<op><number>
//
// Op applies to the ratio: ">=" when higher is better for Lodestone
// (throughput), "<=" when lower is (latency). A comparison of Lodestone
// with itself in another setup may name both sides
// (lodestone-secure=... lodestone-plain=...).
type Line struct {
	Name          string  // e.g. "put-64clients-throughput"
	Unit          string  // e.g. "ops/s", "ms"
	LodestoneName string  // "lodestone" when empty; e.g. "lodestone-secure"
	Lodestone     float64 // Lodestone's figure, in Unit
	PeerName      string  // e.g. "etcd"; for a self-comparison, the baseline's name
	Peer          float64 // the peer's figure, in Unit
	Op            string  // ">=" or "<="
	Target        float64 // the ratio Lodestone must reach
}

// Ratio is Lodestone's figure over the peer's (+Inf or NaN if the peer's is 0).
func (l Line) Ratio() float64 { return l.Lodestone / l.Peer }

// Pass reports whether the ratio, as printed (two decimals), meets the
// target. A NaN ratio never passes.
func (l Line) Pass() bool {
	r, err := strconv.ParseFloat(formatRatio(l.Ratio()), 64)
	if err != nil || math.IsNaN(r) {
		return false
	}
	switch l.Op {
	case ">=":
		return r >= l.Target
	case "<=":
		return r <= l.Target
	}
	return false
}

// String renders the line without a trailing newline.
func (l Line) String() string {
	name := l.LodestoneName
	if name == "" {
		name = "lodestone"
	}
	return fmt.Sprintf("BENCH %s %s=%s%s %s=%s%s ratio=%s target=%s%s",
		l.Name, name, FormatValue(l.Lodestone), l.Unit, l.PeerName, FormatValue(l.Peer), l.Unit,
		formatRatio(l.Ratio()), l.Op, formatTarget(l.Target))
}

// FormatValue prints a measured figure with about three significant digits
// and no trailing zeros: 21400.4 → "21400", 12.34 → "12.3", 4.10 → "4.1",
// 0.8534 → "0.853".
func FormatValue(v float64) string {
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return strconv.FormatFloat(v, 'f', -1, 64)
	}
	var decimals int
	switch a := math.Abs(v); {
	case a >= 100:
		decimals = 0
	case a >= 10:
		decimals = 1
	case a >= 1:
		decimals = 2
	default:
		decimals = 3
	}
	s := strconv.FormatFloat(v, 'f', decimals, 64)
	if strings.Contains(s, ".") {
		s = strings.TrimRight(strings.TrimRight(s, "0"), ".")
	}
	return s
}

// formatRatio prints a ratio with exactly two decimals ("1.63", "0.82").
func formatRatio(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return strconv.FormatFloat(r, 'f', -1, 64)
	}
	return strconv.FormatFloat(r, 'f', 2, 64)
}

// formatTarget prints a target with at least one decimal ("1.0", "1.5").
func formatTarget(t float64) string {
	s := strconv.FormatFloat(t, 'f', -1, 64)
	if !strings.ContainsAny(s, ".eE") {
		s += ".0"
	}
	return s
}
