package harness

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// Scrape takes the first sample of each name, labels included, and says
// which name is missing.
func TestScrape(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "# HELP x_total things\nx_total 7\nq{api=\"http\"} 3\nq{api=\"grpc\"} 4\nx_total 9\n")
	}))
	defer srv.Close()
	ctx := context.Background()
	m, err := Scrape(ctx, srv.URL, "x_total", `q{api="grpc"}`)
	if err != nil || m["x_total"] != 7 || m[`q{api="grpc"}`] != 4 {
		t.Fatalf("Scrape = %v, %v; want x_total 7, q{api=\"grpc\"} 4", m, err)
	}
	if _, err := Scrape(ctx, srv.URL, "absent"); err == nil || !strings.Contains(err.Error(), "absent") {
		t.Errorf("Scrape of a missing metric: %v, want an error naming it", err)
	}
}

func TestBaselineNote(t *testing.T) {
	got := BaselineNote("the p99", 20, 16, 24)
	want := "baseline: the p99 is the median of both control phases of every rep, 20ms; the median of each rep's lower one would be 16ms, a ratio of 1.5"
	if got != want {
		t.Errorf("BaselineNote =\n%s\nwant\n%s", got, want)
	}
}
