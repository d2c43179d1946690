package report

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
	"sort"
	"time"

	"github.com/lodestone-kv/lodestone/chaos/history"
)

// kindColors shades fault windows; unknown kinds get grey.
var kindColors = map[string]string{
	"partition-halves": "#4e79a7",
	"partition-leader": "#f28e2b",
	"partition-bridge": "#76b7b2",
	"kill":             "#e15759",
	"pause-leader":     "#b07aa1",
	"pause":            "#ff9da7",
	"loss":             "#edc948",
	"delay":            "#9c755f",
	"member":           "#59a14f",
}

const maxOKPoints = 15000

// Plot draws operation latency over time on a log scale, one dot per
// operation (ok green, fail orange, info red), with every fault window
// shaded in its kind's color. timeout is the latency axis' floor for its
// top (operations time out there).
func Plot(w io.Writer, h *history.History, timeout time.Duration) error {
	const (
		width, height            = 1400, 560
		left, right, top, bottom = 70, 190, 40, 50
	)
	pw, ph := float64(width-left-right), float64(height-top-bottom)
	end := float64(h.End()) / 1e9
	if end <= 0 {
		end = 1
	}
	maxLat := float64(timeout) / 1e6
	for _, o := range h.Ops {
		maxLat = math.Max(maxLat, float64(o.Latency())/1e6)
	}
	minLat := 0.1
	logMin, logMax := math.Log10(minLat), math.Log10(maxLat*1.2)
	x := func(ns int64) float64 { return float64(left) + pw*(float64(ns)/1e9)/end }
	y := func(ms float64) float64 {
		ms = math.Max(ms, minLat)
		return float64(top) + ph*(1-(math.Log10(ms)-logMin)/(logMax-logMin))
	}
	bw := bufio.NewWriter(w)
	p := func(format string, args ...any) { fmt.Fprintf(bw, format, args...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="11">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	p(`<text x="%d" y="20" font-size="14">Operation latency over time (log scale), fault windows shaded</text>`+"\n", left)

	// Fault windows.
	used := map[string]bool{}
	for _, f := range h.Faults {
		if f.Skipped {
			continue
		}
		c, ok := kindColors[f.Kind]
		if !ok {
			c = "#999999"
		}
		used[f.Kind] = true
		x0, x1 := x(f.Start), x(f.End)
		p(`<rect x="%.1f" y="%d" width="%.1f" height="%.0f" fill="%s" fill-opacity="0.22"><title>%s</title></rect>`+"\n",
			x0, top, math.Max(x1-x0, 1), ph, c, html.EscapeString(fmt.Sprintf("#%d %s %s %s", f.ID, f.Kind, f.Target, f.Detail)))
	}
	// Axes and grid.
	p(`<rect x="%d" y="%d" width="%.0f" height="%.0f" fill="none" stroke="#333"/>`+"\n", left, top, pw, ph)
	for e := math.Ceil(logMin); e <= logMax; e++ {
		ms := math.Pow(10, e)
		yy := y(ms)
		p(`<line x1="%d" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#ccc" stroke-dasharray="2,3"/>`+"\n", left, float64(left)+pw, yy, yy)
		p(`<text x="%d" y="%.1f" text-anchor="end">%s</text>`+"\n", left-6, yy+4, fmtMS(ms))
	}
	p(`<text x="16" y="%.0f" transform="rotate(-90 16 %.0f)" text-anchor="middle">latency</text>`+"\n", float64(top)+ph/2, float64(top)+ph/2)
	step := niceStep(end / 10)
	for t := 0.0; t <= end; t += step {
		xx := x(int64(t * 1e9))
		p(`<line x1="%.1f" x2="%.1f" y1="%.0f" y2="%.0f" stroke="#333"/>`+"\n", xx, xx, float64(top)+ph, float64(top)+ph+5)
		p(`<text x="%.1f" y="%.0f" text-anchor="middle">%gs</text>`+"\n", xx, float64(top)+ph+18, t)
	}
	p(`<text x="%.0f" y="%d" text-anchor="middle">time since start</text>`+"\n", float64(left)+pw/2, height-10)

	// Operations: ok (subsampled when there are many), then fail and info
	// on top so they stay visible.
	var okOps []history.Op
	for _, o := range h.Ops {
		if o.Type == history.OK {
			okOps = append(okOps, o)
		}
	}
	stride := 1
	if len(okOps) > maxOKPoints {
		stride = (len(okOps) + maxOKPoints - 1) / maxOKPoints
	}
	p(`<g fill="#2a9d3c" fill-opacity="0.45">` + "\n")
	for i := 0; i < len(okOps); i += stride {
		o := okOps[i]
		p(`<circle cx="%.1f" cy="%.1f" r="1.3"/>`+"\n", x(o.Call), y(float64(o.Latency())/1e6))
	}
	p("</g>\n")
	p(`<g fill="#f08c00" fill-opacity="0.8">` + "\n")
	for _, o := range h.Ops {
		if o.Type == history.Fail {
			p(`<circle cx="%.1f" cy="%.1f" r="1.8"/>`+"\n", x(o.Call), y(float64(o.Latency())/1e6))
		}
	}
	p("</g>\n")
	p(`<g stroke="#d00000" stroke-width="1.2">` + "\n")
	for _, o := range h.Ops {
		if o.Type == history.Info {
			xx, yy := x(o.Call), y(float64(o.Latency())/1e6)
			p(`<path d="M%.1f %.1fl4 4m0 -4l-4 4"/>`+"\n", xx-2, yy-2)
		}
	}
	p("</g>\n")

	// Legend.
	lx, ly := float64(left)+pw+16, float64(top)+4
	legend := func(swatch, label string) {
		p(`%s<text x="%.0f" y="%.0f">%s</text>`+"\n", swatch, lx+18, ly+9, html.EscapeString(label))
		ly += 18
	}
	legend(fmt.Sprintf(`<circle cx="%.0f" cy="%.0f" r="4" fill="#2a9d3c"/>`, lx+6, ly+5), fmt.Sprintf("ok (1 in %d shown)", stride))
	legend(fmt.Sprintf(`<circle cx="%.0f" cy="%.0f" r="4" fill="#f08c00"/>`, lx+6, ly+5), "fail (not applied)")
	legend(fmt.Sprintf(`<path d="M%.0f %.0fl8 8m0 -8l-8 8" stroke="#d00000" stroke-width="1.5"/>`, lx+2, ly+1), "info (unknown)")
	ly += 8
	kinds := make([]string, 0, len(used))
	for k := range used {
		kinds = append(kinds, k)
	}
	sort.Strings(kinds)
	for _, k := range kinds {
		c, ok := kindColors[k]
		if !ok {
			c = "#999999"
		}
		legend(fmt.Sprintf(`<rect x="%.0f" y="%.0f" width="12" height="12" fill="%s" fill-opacity="0.5"/>`, lx, ly, c), k)
	}
	p("</svg>\n")
	return bw.Flush()
}

func fmtMS(ms float64) string {
	if ms >= 1000 {
		return fmt.Sprintf("%gs", ms/1000)
	}
	return fmt.Sprintf("%gms", ms)
}

func niceStep(raw float64) float64 {
	if raw <= 0 {
		return 1
	}
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	for _, m := range []float64{1, 2, 5, 10} {
		if raw <= m*mag {
			return m * mag
		}
	}
	return 10 * mag
}
