package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// profileWindow saves a CPU profile of every server over the next d into
// dir/<tag>-<server>.pprof, retrying a server not up yet (a restart)
// until it answers or d has passed. Wait returns when every one is done.
func profileWindow(c *cluster, dir, tag string, d time.Duration, log io.Writer) (wait func()) {
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	secs := max(int(d.Seconds()), 1)
	for _, s := range c.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := filepath.Join(dir, tag+"-"+s.name+".pprof")
			cl := &http.Client{Timeout: d + 30*time.Second}
			for time.Now().Before(deadline) {
				resp, err := cl.Get(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", s.http, secs))
				if err != nil {
					time.Sleep(50 * time.Millisecond)
					continue
				}
				err = saveBody(resp, path)
				if err != nil {
					fmt.Fprintf(log, "drill: profile %s: %v\n", path, err)
				}
				return
			}
		}()
	}
	return wg.Wait
}

func saveBody(resp *http.Response, path string) error {
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %s", resp.Status)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
