package compact

import (
	"fmt"
	"io"
	"strings"
	"time"
)

// Bar draws one progress line, "<label> [=====>    ]  45%  <tail>", redrawn
// in place with \r at most once per every. The operator commands that run
// long (compact, snapshot save) share it. A nil writer draws nothing.
type Bar struct {
	w               io.Writer
	now             func() time.Time
	every           time.Duration
	label           string
	start, lastDraw time.Time
	done, total     int64
	tail            func(elapsed time.Duration) string
	seq, shownSeq   int
	drawn           bool
}

// NewBar starts a bar; now supplies its timestamps.
func NewBar(w io.Writer, now func() time.Time, every time.Duration, label string) *Bar {
	return &Bar{w: w, now: now, every: every, label: label, start: now()}
}

// Update records done of total; tail renders what follows the percentage,
// given the time since the bar started. It redraws if due.
func (b *Bar) Update(done, total int64, tail func(elapsed time.Duration) string) {
	b.done, b.total, b.tail = done, total, tail
	b.seq++
	if b.w == nil {
		return
	}
	if t := b.now(); !b.drawn || t.Sub(b.lastDraw) >= b.every {
		b.lastDraw = t
		b.draw()
	}
}

// Finish draws the final state, if not shown yet and ok, and ends the line.
func (b *Bar) Finish(ok bool) {
	if b.w == nil || !b.drawn {
		return
	}
	if ok && b.shownSeq != b.seq {
		b.draw()
	}
	fmt.Fprintln(b.w)
}

func (b *Bar) draw() {
	const width = 30
	frac := 1.0
	if b.total > 0 {
		frac = min(float64(b.done)/float64(b.total), 1)
	}
	filled := int(frac * width)
	arrow := ""
	if filled < width {
		arrow = ">"
	}
	fmt.Fprintf(b.w, "\r%s [%s%s%s] %3.0f%%  %s", b.label,
		strings.Repeat("=", filled), arrow, strings.Repeat(" ", max(width-filled-len(arrow), 0)),
		frac*100, b.tail(b.now().Sub(b.start)))
	b.drawn, b.shownSeq = true, b.seq
}

// rate renders n per second over elapsed, or "-" before any time passed.
func rate(n float64, elapsed time.Duration, unit string) string {
	if secs := elapsed.Seconds(); secs > 0 {
		return fmt.Sprintf("%.0f %s", n/secs, unit)
	}
	return "-"
}
