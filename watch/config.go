package watch

import (
	"log/slog"
	"runtime"
	"time"
)

// Config configures a Hub. Zero values take the defaults below, except
// where a field says otherwise.
type Config struct {
	// Shards is the number of shards (each a lock, a goroutine and a cursor
	// on the log). Default (0): 2×GOMAXPROCS at New. More shards spread
	// matching over more cores and shorten each shard's critical sections;
	// each shard costs one wake-up per Publish while it is idle.
	Shards int

	// RetainEvents bounds the events kept in the log for resuming watchers.
	// Default (0): 100000. Larger lets clients resume after longer
	// disconnects (fewer full reloads) at ~128 B + key + value per event.
	// At least the newest index is always kept.
	RetainEvents int

	// RetainBytes bounds the estimated bytes of events kept in the log (key,
	// value, session, PrevKV and ~128 B of overhead each). Default (0):
	// 32 MiB. Whichever of RetainEvents and RetainBytes is hit first evicts.
	// The log is on the heap, so with the GC's headroom it costs about
	// twice this in resident memory once full.
	RetainBytes int64

	// WatcherBuffer is the number of events buffered per watcher before it
	// is cut loose with an *OverflowError (a Request may override it).
	// Default (0): 1024. Larger tolerates burstier consumers; a consumer
	// that never reads pins up to this many events (8 B each plus the
	// shared event).
	WatcherBuffer int

	// ProgressInterval is how often idle watchers get a progress
	// notification with the current index, measured on Clock: a watcher
	// that heard nothing (no event, no progress) since the previous round
	// is told the current index, so a quiet watcher's resume point is at
	// most about two intervals old, and one that gets events is not told
	// again. A round is spread over the interval: every interval/16 the
	// watchers of one sixteenth (by Ready list, else by watcher id) are
	// visited, so 100k quiet watchers cost 16 small bursts of
	// notifications, not one large one, and a consumer serving many
	// watchers through one Ready (a gRPC stream) is woken once per
	// interval for all of them.
	// The same visits close unread watchers whose Watch context is done
	// and sample buffer occupancy. Default (0): 10s. Negative disables the
	// timer; Hub.Progress still works (and tells every watcher behind at
	// once). Shorter means fresher resume points for quiet watchers at the
	// cost of one pass over every watcher per interval/16 (spread over the
	// shards; a pass skips the watchers of other slices unlocked).
	ProgressInterval time.Duration

	// Clock is the time source for progress timers, Wait timeouts and the
	// delivery-lag metric. Default (nil): SystemClock().
	Clock Clock

	// Logger receives cut-loose notices (Info) and per-watcher detail
	// (Debug). Default (nil): discard.
	Logger *slog.Logger
}

// DefaultConfig returns the configuration a production server uses.
func DefaultConfig() Config {
	return Config{
		Shards:           2 * runtime.GOMAXPROCS(0), // matching runs in parallel on every core, with slack for skew
		RetainEvents:     100_000,                   // ~minutes of heavy writes; resumes beyond this reload
		RetainBytes:      32 << 20,                  // 32 MiB of retained events at most
		WatcherBuffer:    1024,                      // a slow consumer may lag ~1k events before it is cut
		ProgressInterval: 10 * time.Second,          // quiet watchers learn the index every 10s
		Clock:            SystemClock(),
		Logger:           nil, // discard
	}
}

// Validate reports the first invalid field as a *ConfigError.
func (c Config) Validate() error {
	switch {
	case c.Shards < 0:
		return &ConfigError{Field: "Shards", Reason: "must be ≥ 0"}
	case c.Shards > 1<<16:
		return &ConfigError{Field: "Shards", Reason: "must be ≤ 65536"}
	case c.RetainEvents < 0:
		return &ConfigError{Field: "RetainEvents", Reason: "must be ≥ 0"}
	case c.RetainBytes < 0:
		return &ConfigError{Field: "RetainBytes", Reason: "must be ≥ 0"}
	case c.WatcherBuffer < 0:
		return &ConfigError{Field: "WatcherBuffer", Reason: "must be ≥ 0"}
	case c.WatcherBuffer > maxBuffer:
		return &ConfigError{Field: "WatcherBuffer", Reason: "must be ≤ 2^31-1"}
	}
	return nil
}

const maxBuffer = 1<<31 - 1

// withDefaults fills zero fields.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Shards == 0 {
		c.Shards = d.Shards
	}
	if c.RetainEvents == 0 {
		c.RetainEvents = d.RetainEvents
	}
	if c.RetainBytes == 0 {
		c.RetainBytes = d.RetainBytes
	}
	if c.WatcherBuffer == 0 {
		c.WatcherBuffer = d.WatcherBuffer
	}
	if c.ProgressInterval == 0 {
		c.ProgressInterval = d.ProgressInterval
	}
	if c.Clock == nil {
		c.Clock = d.Clock
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}
