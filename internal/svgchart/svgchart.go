// Package svgchart draws the small charts of the web UIs as inline SVG:
// a sparkline of a series and a row of horizontal bars. Colours come from
// CSS classes (the UIs' stylesheets), never from style attributes, so the
// pages keep a Content-Security-Policy without 'unsafe-inline'.
package svgchart

import (
	"fmt"
	"html/template"
	"math"
	"strings"
)

// Sparkline draws values, oldest first, as a polyline w×h pixels scaled
// from 0 (or the smallest value, if negative) to the largest, with the last
// point marked. NaN and infinite values are left out. Fewer than two
// usable points draw an empty frame, so a page keeps its layout while a
// series is starting.
func Sparkline(values []float64, w, h int) template.HTML {
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="spark" width="%d" height="%d" viewBox="0 0 %d %d" role="img">`, w, h, w, h)
	pts := finite(values)
	if len(pts) >= 2 {
		lo, hi := 0.0, 0.0
		for _, p := range pts {
			lo, hi = math.Min(lo, p.v), math.Max(hi, p.v)
		}
		span := hi - lo
		if span == 0 {
			span = 1
		}
		x := func(i int) float64 { return 1 + float64(i)*float64(w-2)/float64(len(values)-1) }
		y := func(v float64) float64 { return float64(h-2) - (v-lo)/span*float64(h-4) + 1 }
		b.WriteString(`<polyline class="spark-line" fill="none" points="`)
		for i, p := range pts {
			if i > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%.1f,%.1f", x(p.i), y(p.v))
		}
		b.WriteString(`"/>`)
		last := pts[len(pts)-1]
		fmt.Fprintf(&b, `<circle class="spark-dot" cx="%.1f" cy="%.1f" r="2"/>`, x(last.i), y(last.v))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

type point struct {
	i int
	v float64
}

func finite(values []float64) []point {
	out := make([]point, 0, len(values))
	for i, v := range values {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			out = append(out, point{i, v})
		}
	}
	return out
}

// Bar is one bar: a label, its value, the CSS class that colours it
// (empty: the default bar colour), and the text written beside it (empty:
// the value).
type Bar struct {
	Label string
	Value float64
	Class string
	Text  string
}

// Bars draws one horizontal bar per item, w pixels wide, each scaled
// against the largest value (or max, when it is larger), with its label
// and value written beside it.
func Bars(items []Bar, max float64, w int) template.HTML {
	const rowH, labelW, valueW = 16, 90, 70
	for _, it := range items {
		if it.Value > max {
			max = it.Value
		}
	}
	barW := float64(w - labelW - valueW)
	h := rowH * len(items)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg class="bars" width="%d" height="%d" viewBox="0 0 %d %d" role="img">`, w, h, w, h)
	for i, it := range items {
		y := i * rowH
		bw := 0.0
		if max > 0 && it.Value > 0 {
			bw = math.Max(1, it.Value/max*barW)
		}
		class := "bar"
		if it.Class != "" {
			class += " " + it.Class
		}
		fmt.Fprintf(&b, `<text class="bar-label" x="0" y="%d">%s</text>`, y+12, template.HTMLEscapeString(it.Label))
		fmt.Fprintf(&b, `<rect class="%s" x="%d" y="%d" width="%.1f" height="%d"/>`, template.HTMLEscapeString(class), labelW, y+2, bw, rowH-4)
		text := it.Text
		if text == "" {
			text = formatValue(it.Value)
		}
		fmt.Fprintf(&b, `<text class="bar-value" x="%d" y="%d">%s</text>`, w-valueW+4, y+12, template.HTMLEscapeString(text))
	}
	b.WriteString(`</svg>`)
	return template.HTML(b.String())
}

// formatValue writes v compactly: integers as they are, others with three
// significant digits.
func formatValue(v float64) string {
	if v == math.Trunc(v) && math.Abs(v) < 1e15 {
		return fmt.Sprintf("%d", int64(v))
	}
	return fmt.Sprintf("%.3g", v)
}
