package ui_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/server"
	"github.com/lodestone-kv/lodestone/server/servertest"
)

// ready waits until srv leads and has published its addresses: the last
// writes a server makes by itself at start.
func ready(t testing.TB, srv *server.Server) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		if srv.Ready() == nil {
			for _, m := range srv.Store().Members() {
				if m.HttpAddr == srv.AdvertisedHTTP() {
					return
				}
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatal("server not ready with its addresses published within 10s")
}

func proposals(t *testing.T, srv *server.Server) float64 {
	t.Helper()
	fams, err := srv.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, f := range fams {
		if f.GetName() == "lodestone_proposals_total" {
			for _, m := range f.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

// htmlEvents counts a stream's html events, sending each count on the
// channel.
func htmlEvents(t *testing.T, ctx context.Context, url string) <-chan int {
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	out := make(chan int, 64)
	go func() {
		defer resp.Body.Close()
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 1<<20)
		n := 0
		for sc.Scan() {
			if sc.Text() == "event: html" {
				n++
				out <- n
			}
		}
	}()
	return out
}

func TestOpenUIAddsNoRaftWrites(t *testing.T) {
	srv := servertest.Start(t, nil)
	ready(t, srv)
	base := "http://" + srv.HTTPAddr()
	req, _ := http.NewRequest(http.MethodPut, base+"/v1/kv/app/x", strings.NewReader("v"))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	applied, props := srv.Store().Index(), proposals(t, srv)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pages := []string{"cluster", "raftlog", "watches", "services", "kv?prefix=app/", "kv/edit?key=app/x", "sessions"}
	var streams []<-chan int
	for _, p := range pages {
		resp, err := http.Get(base + "/ui/" + p)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.Contains(string(body), `id="live"`) {
			t.Fatalf("/ui/%s: %d", p, resp.StatusCode)
		}
		streams = append(streams, htmlEvents(t, ctx, base+"/ui/events/"+p))
	}
	// Every stream draws its region; the metrics pages draw it again after
	// their next sample, so their whole loop has run at least once.
	for i, ch := range streams {
		want := 1
		if i < 3 {
			want = 2
		}
		deadline := time.After(15 * time.Second)
		for got := 0; got < want; {
			select {
			case got = <-ch:
			case <-deadline:
				t.Fatalf("stream %s sent %d html events, want %d", pages[i], got, want)
			}
		}
	}
	if got := srv.Store().Index(); got != applied {
		t.Fatalf("applied index moved from %d to %d while the UI was open", applied, got)
	}
	if got := proposals(t, srv); got != props {
		t.Fatalf("proposals went from %v to %v while the UI was open", props, got)
	}
}

func TestUIOffAnswersNotFound(t *testing.T) {
	srv := servertest.Start(t, func(c *server.Config) { c.UI = false })
	resp, err := http.Get("http://" + srv.HTTPAddr() + "/ui/cluster")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("--ui=false: /ui/cluster answered %d, want 404", resp.StatusCode)
	}
}
