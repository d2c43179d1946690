package tlsutil

import (
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"time"
)

// DefaultWatchInterval is how often the commands poll their TLS files.
const DefaultWatchInterval = time.Second

// Watch reloads the Store when its files change, until ctx ends (see the
// package doc for why it polls). Failed reloads are logged and counted
// by Reload, once per change.
func (s *Store) Watch(ctx context.Context, interval time.Duration) {
	watch(ctx, interval, func() []string { return []string{s.files.CAFile, s.files.CertFile, s.files.KeyFile} },
		s.Reload, s.opts.Logger)
}

// watch calls reload once the contents of paths() changed since the last
// reload and then held still for one interval: a rotation writes the
// certificate and the key one after the other, and reloading between the
// two would only count a failure.
func watch(ctx context.Context, interval time.Duration, paths func() []string, reload func() error, logger *slog.Logger) {
	if interval <= 0 {
		return
	}
	loaded := fingerprint(paths())
	last := loaded
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fp := fingerprint(paths())
		if fp == last && fp != loaded {
			logger.Debug("TLS files changed; reloading")
			_ = reload() // NB: logged and counted by reload
			loaded = fp
		}
		last = fp
	}
}

// fingerprint hashes the names and contents of files; an unreadable file
// hashes as its name alone, so it counts as a change too.
func fingerprint(files []string) [32]byte {
	h := sha256.New()
	for _, f := range files {
		if f == "" {
			continue
		}
		h.Write([]byte(f))
		h.Write([]byte{0})
		if b, err := os.ReadFile(f); err == nil {
			h.Write(b)
		}
		h.Write([]byte{0})
	}
	var out [32]byte
	h.Sum(out[:0])
	return out
}
