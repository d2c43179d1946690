package webui

import (
	"fmt"
	"html/template"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/internal/svgchart"
)

// Funcs are the template functions every page may use.
func Funcs() template.FuncMap {
	return template.FuncMap{
		"bytes":    Bytes,
		"num":      Num,
		"secs":     Seconds,
		"pct":      Percent,
		"ago":      Ago,
		"since":    func(t time.Time) string { return Ago(now().Sub(t)) },
		"hex":      func(v uint64) string { return strconv.FormatUint(v, 16) },
		"join":     strings.Join,
		"spark":    svgchart.Sparkline,
		"bars":     svgchart.Bars,
		"nan":      math.IsNaN,
		"sub":      func(a, b int) int { return a - b },
		"add":      func(a, b int) int { return a + b },
		"clock":    func(t time.Time) string { return t.Format("15:04:05") },
		"truncate": Truncate,
	}
}

// Bytes writes n in IEC units: 512 B, 3.9 GiB. NaN is "–".
func Bytes(n float64) string {
	if math.IsNaN(n) {
		return "–"
	}
	const unit = 1024
	if math.Abs(n) < unit {
		return fmt.Sprintf("%.0f B", n)
	}
	div, exp := float64(unit), 0
	for m := math.Abs(n) / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", n/div, "KMGTPE"[exp])
}

// Num writes an integer-valued figure with thousands separators, others
// with three significant digits. NaN is "–".
func Num(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return "–"
	case v != math.Trunc(v) || math.Abs(v) >= 1e15:
		return strconv.FormatFloat(v, 'g', 3, 64)
	}
	s := strconv.FormatInt(int64(math.Abs(v)), 10)
	var b strings.Builder
	if v < 0 {
		b.WriteByte('-')
	}
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	return b.String()
}

// Seconds writes a latency in seconds in the unit that reads best:
// 850 µs, 12.4 ms, 2.10 s. NaN is "–" (no observations).
func Seconds(s float64) string {
	switch {
	case math.IsNaN(s) || math.IsInf(s, 0):
		return "–"
	case s < 1e-3:
		return fmt.Sprintf("%.0f µs", s*1e6)
	case s < 1:
		return fmt.Sprintf("%.1f ms", s*1e3)
	}
	return fmt.Sprintf("%.2f s", s)
}

// Percent writes a ratio as a percentage. NaN is "–".
func Percent(r float64) string {
	if math.IsNaN(r) || math.IsInf(r, 0) {
		return "–"
	}
	return fmt.Sprintf("%.0f%%", r*100)
}

// Ago writes a duration as a person reads an age: 350ms, 4.2s, 3m10s.
func Ago(d time.Duration) string {
	switch {
	case d < 0:
		d = 0
	case d < time.Second:
		return d.Round(time.Millisecond).String()
	case d < time.Minute:
		return d.Round(100 * time.Millisecond).String()
	}
	return d.Round(time.Second).String()
}

// Truncate cuts s to n runes, marking the cut.
func Truncate(n int, s string) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n]) + "…"
}
