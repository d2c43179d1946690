package client

import (
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// WatchOption configures a Watch.
type WatchOption func(*watchSettings)

type watchSettings struct {
	prefix, prevKV, noPut, noDelete, progress bool
	catalog                                   bool // WatchCatalogServices
	start                                     uint64
	buffer                                    int
	giveUp                                    time.Duration
}

func (s *watchSettings) target() lodestonepb.WatchTarget {
	if s.catalog {
		return lodestonepb.WatchTarget_WATCH_TARGET_CATALOG_SERVICES
	}
	return lodestonepb.WatchTarget_WATCH_TARGET_KV
}

// DefaultWatchBuffer is how many events a Watch queues for its consumer
// before the client stops feeding it (see WatchBuffer).
const DefaultWatchBuffer = 4096

// WatchPrefix watches every key that starts with the given key ("" with
// WatchPrefix watches every key).
func WatchPrefix() WatchOption { return func(s *watchSettings) { s.prefix = true } }

// FromIndex delivers every matching event with index > idx, replayed from
// the server's retained history when idx lies in the past: pass the
// Header.Index of the read the watch follows up, or the Index of the last
// batch a previous watch returned. idx 0 (the default) means "from now".
// An idx older than the server's retained history ends the watch with
// ErrCompacted.
func FromIndex(idx uint64) WatchOption { return func(s *watchSettings) { s.start = idx } }

// WithPrevKV asks for each event's previous entry (Event.PrevKv).
func WithPrevKV() WatchOption { return func(s *watchSettings) { s.prevKV = true } }

// NoPut drops put events.
func NoPut() WatchOption { return func(s *watchSettings) { s.noPut = true } }

// NoDelete drops delete events.
func NoDelete() WatchOption { return func(s *watchSettings) { s.noDelete = true } }

// WithProgressNotify makes Next also return progress batches (no events,
// a newer Index) when the server reports that the watch is up to date.
// Without it progress only moves Watch.Index and the resume point.
func WithProgressNotify() WatchOption { return func(s *watchSettings) { s.progress = true } }

// WatchCatalogServices makes the watch follow the catalog's
// service-instance events instead of KV keys: the key passed to Watch is a
// service name, "" for every service (WatchPrefix is implied). Events are
// read-only views of the store's reserved keys; decode them with
// DecodeServiceInstanceEvent. FromIndex, progress, resume and ErrCompacted
// work as for KV watches, so a reader loads the catalog (Services, Health)
// and follows it from the reads' index.
func WatchCatalogServices() WatchOption { return func(s *watchSettings) { s.catalog = true } }

// WatchBuffer caps the events queued for the consumer (default
// DefaultWatchBuffer; n < 1 means the default). When the queue reaches n
// the client cancels the watch on its stream, so a slow consumer never
// holds up the other watches sharing it, and creates it again from the
// last queued index once Next has drained half of the queue. If the server
// no longer retains that index by then, the watch ends with ErrCompacted.
func WatchBuffer(n int) WatchOption { return func(s *watchSettings) { s.buffer = n } }

// WatchGiveUpAfter ends the watch with ErrUnavailable once no server has
// served the client's watch stream for d (counting from the Watch call or
// from the last stream break). Default (0): retry until the watch's ctx
// ends or it is closed.
func WatchGiveUpAfter(d time.Duration) WatchOption { return func(s *watchSettings) { s.giveUp = d } }
