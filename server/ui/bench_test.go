package ui_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/server/servertest"
)

// BenchmarkUIPages times every page against a real server holding 10,000
// keys and 1,000 service instances, and reports each page's p99 in ms
// (p99-ms). `make bench-ui` runs it five times and prints the median of
// the runs as BENCH ui-page-p99 <page>=<ms>.
func BenchmarkUIPages(b *testing.B) {
	srv := servertest.Start(b, nil)
	ready(b, srv)
	base := "http://" + srv.HTTPAddr()
	load(b, base)
	c := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for _, p := range []string{"cluster", "raftlog", "watches", "services", "services/svc-7", "nodes/node-7",
		"kv", "kv?prefix=app/7/", "kv/edit?key=app/7/7", "sessions"} {
		b.Run(p, func(b *testing.B) {
			get(b, c, base+"/ui/"+p) // warm: the first sample of the metrics pages
			lat := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				start := time.Now()
				get(b, c, base+"/ui/"+p)
				lat = append(lat, time.Since(start))
			}
			b.StopTimer()
			slices.Sort(lat)
			p99 := lat[min(len(lat)-1, len(lat)*99/100)]
			b.ReportMetric(float64(p99.Microseconds())/1000, "p99-ms")
		})
	}
}

func get(b testing.TB, c *http.Client, url string) {
	resp, err := c.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("%s: %d", url, resp.StatusCode)
	}
}

// load writes 10,000 keys (app/<i%100>/<i>, in transactions of 64) and
// registers 1,000 instances of 50 services on 200 nodes, half of them with
// a failing check, through the Consul API.
func load(b testing.TB, base string) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	do := func(method, path string, body any) {
		buf, _ := json.Marshal(body)
		req, _ := http.NewRequest(method, base+path, bytes.NewReader(buf))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			errs <- err
			return
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			errs <- fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, msg)
		}
	}
	work := make(chan func(), 64)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for f := range work {
				f()
			}
		}()
	}
	for start := 0; start < 10000; start += 64 {
		var ops []map[string]any
		for i := start; i < min(start+64, 10000); i++ {
			ops = append(ops, map[string]any{"KV": map[string]any{"Verb": "set", "Key": fmt.Sprintf("app/%d/%d", i%100, i), "Value": []byte("value")}})
		}
		work <- func() { do(http.MethodPut, "/v1/txn", ops) }
	}
	for i := range 1000 {
		status := "passing"
		if i%2 == 1 {
			status = "critical"
		}
		reg := map[string]any{
			"Node": fmt.Sprintf("node-%d", i%200), "Address": fmt.Sprintf("10.0.%d.%d", i%200/250, i%200),
			"Service": map[string]any{"ID": fmt.Sprintf("svc-%d-%d", i%50, i), "Service": fmt.Sprintf("svc-%d", i%50), "Port": 8000 + i, "Tags": []string{"v1"}},
			"Check":   map[string]any{"CheckID": fmt.Sprintf("chk-%d", i), "Name": "http", "Status": status, "ServiceID": fmt.Sprintf("svc-%d-%d", i%50, i), "Output": "HTTP GET /health: 200 OK"},
		}
		work <- func() { do(http.MethodPut, "/v1/catalog/register", reg) }
	}
	close(work)
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}
