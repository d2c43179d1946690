package svgchart

import (
	"math"
	"strings"
	"testing"
)

func TestSparklineScalesToTheFrame(t *testing.T) {
	got := string(Sparkline([]float64{0, 5, 10}, 102, 22))
	// x spans 1..101, y spans 21 (value 0) .. 3 (value 10).
	if !strings.Contains(got, `points="1.0,21.0 51.0,12.0 101.0,3.0"`) {
		t.Fatalf("points not scaled to the frame: %s", got)
	}
	if !strings.Contains(got, `<circle class="spark-dot" cx="101.0" cy="3.0"`) {
		t.Fatalf("last point not marked: %s", got)
	}
	if strings.Contains(got, "style=") {
		t.Fatalf("style attribute would need unsafe-inline: %s", got)
	}
}

func TestSparklineSkipsGapsAndShortSeries(t *testing.T) {
	if got := string(Sparkline([]float64{3}, 50, 10)); strings.Contains(got, "polyline") {
		t.Fatalf("one point drew a line: %s", got)
	}
	got := string(Sparkline([]float64{1, math.NaN(), 3}, 50, 10))
	if strings.Count(strings.Split(got, `points="`)[1], ",") != 2 {
		t.Fatalf("NaN not left out: %s", got)
	}
}

func TestBarsEscapeLabelsAndScale(t *testing.T) {
	got := string(Bars([]Bar{{Label: "<a>", Value: 2}, {Label: "b", Value: 4, Class: "warn"}}, 0, 260))
	if strings.Contains(got, "<a>") || !strings.Contains(got, "&lt;a&gt;") {
		t.Fatalf("label not escaped: %s", got)
	}
	// 260 - 90 - 70 = 100 px for the largest value.
	if !strings.Contains(got, `class="bar warn" x="90" y="18" width="100.0"`) || !strings.Contains(got, `width="50.0"`) {
		t.Fatalf("bars not scaled to the largest: %s", got)
	}
	if got := string(Bars([]Bar{{Label: "z", Value: 2048, Text: "2.0 KiB"}}, 0, 260)); !strings.Contains(got, ">2.0 KiB<") {
		t.Fatalf("a bar's text not written: %s", got)
	}
	if got := string(Bars([]Bar{{Label: "z", Value: 0}}, 10, 260)); !strings.Contains(got, `width="0.0"`) {
		t.Fatalf("zero drew a bar: %s", got)
	}
}
