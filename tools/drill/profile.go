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

// Profile kinds profileWindow saves: a CPU profile, and an execution
// trace (scheduling delays, blocking on locks and channels, syscalls, by
// goroutine: what a commit waited for when CPU time does not explain it).
const (
	cpuProfile = "profile"
	execTrace  = "trace"
)

// profileWindow saves a profile of kind (cpuProfile, execTrace) of every
// server over the next d into dir/<tag>-<server>.<kind>, retrying a server
// not up yet (a restart) until it answers or d has passed. Wait returns
// when every one is done.
func profileWindow(c *cluster, kind, dir, tag string, d time.Duration, log io.Writer) (wait func()) {
	var wg sync.WaitGroup
	deadline := time.Now().Add(d)
	secs := max(int(d.Seconds()), 1)
	for _, s := range c.servers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			path := filepath.Join(dir, tag+"-"+s.name+"."+kind)
			cl := &http.Client{Timeout: d + 30*time.Second}
			for time.Now().Before(deadline) {
				resp, err := cl.Get(fmt.Sprintf("http://%s/debug/pprof/%s?seconds=%d", s.http, kind, secs))
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
