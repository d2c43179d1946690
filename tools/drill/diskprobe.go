package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// diskProbe measures the device the servers' data lives on, apart from
// them: every interval it rewrites one 4 KiB block of a file beside
// their directories and fdatasyncs it, as the log's Save does. The three
// servers share that device, so a window whose commit p99 rose with the
// probe's worst fdatasync met a device that stalled under all of them
// (a host's hiccup, which no member can route around), and one whose
// commit p99 rose alone is the servers' own. The probe's figure includes
// its goroutine's wait for a CPU; a stall of the device is an order of
// magnitude above that.
type diskProbe struct {
	f     *os.File
	every time.Duration

	mu      sync.Mutex
	samples []probeSample

	stop chan struct{}
	done chan struct{}
}

// probeSample is one fdatasync: when it ended and how long it took.
type probeSample struct {
	at   time.Time
	took time.Duration
}

// startDiskProbe starts probing a file it creates in dir.
func startDiskProbe(dir string, every time.Duration) (*diskProbe, error) {
	f, err := os.OpenFile(filepath.Join(dir, "disk-probe"), os.O_CREATE|os.O_RDWR|os.O_TRUNC, 0o644)
	if err != nil {
		return nil, fmt.Errorf("disk probe: %w", err)
	}
	p := &diskProbe{f: f, every: every, stop: make(chan struct{}), done: make(chan struct{})}
	go p.run()
	return p, nil
}

func (p *diskProbe) run() {
	defer close(p.done)
	block := make([]byte, 4096)
	t := time.NewTicker(p.every)
	defer t.Stop()
	for n := 0; ; n++ {
		select {
		case <-p.stop:
			return
		case <-t.C:
		}
		block[0] = byte(n)
		if p.sync(block) != nil {
			// NB: a probe that cannot write says nothing about the
			// device's latency; the servers' own errors tell the rest.
			return
		}
	}
}

// sync rewrites block at the file's start, fdatasyncs it and records how
// long that took.
func (p *diskProbe) sync(block []byte) error {
	start := time.Now()
	_, err := p.f.WriteAt(block, 0)
	if err == nil {
		err = unix.Fdatasync(int(p.f.Fd()))
	}
	if err != nil {
		return err
	}
	end := time.Now()
	p.mu.Lock()
	p.samples = append(p.samples, probeSample{at: end, took: end.Sub(start)})
	p.mu.Unlock()
	return nil
}

// worst is the longest fdatasync that ended in [from, to), 0 if none did.
func (p *diskProbe) worst(from, to time.Time) time.Duration {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	// NB: samples are in time order; a window's are a contiguous run.
	i, _ := slices.BinarySearchFunc(p.samples, from, func(s probeSample, t time.Time) int { return s.at.Compare(t) })
	var w time.Duration
	for _, s := range p.samples[i:] {
		if !s.at.Before(to) {
			break
		}
		w = max(w, s.took)
	}
	return w
}

// close stops the probe and removes its file.
func (p *diskProbe) close() {
	close(p.stop)
	<-p.done
	p.f.Close()
	os.Remove(p.f.Name())
}
