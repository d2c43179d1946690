package raftlog

// Test-only access to rotation internals, for the package's external tests.

// RotateSteps lists the named steps of a rotation, in order.
var RotateSteps = rotateSteps

// WithRotateHook returns o with f called at each rotation step (f may kill
// the process: the crash tests do) and copy chunks of chunkEntries entries
// (0 keeps the default).
func WithRotateHook(o Options, chunkEntries int, f func(step string)) Options {
	o.hooks = &testHooks{rotateStep: f, chunkEntries: chunkEntries}
	return o
}

// RotationPolicy exposes the rotation policy with its time inputs.
var RotationPolicy = rotationDue

// WithCompactHook returns o with f called between two chunks of a
// Compact, with the write lock released.
func WithCompactHook(o Options, f func()) Options {
	o.hooks = &testHooks{compactChunk: f}
	return o
}

// CompactChunkEntries is the most entries one Compact transaction deletes.
const CompactChunkEntries = compactChunkEntries

// FoldSteps lists the named steps of a background checkpoint and of the
// slot switch that starts it.
var FoldSteps = []string{stepSlotSwitched, stepFoldBegin, stepFoldWritten, stepFoldCommitted}

// WithFoldHook returns o with f called at each step of a background
// checkpoint (on the fold goroutine) and of a slot switch (in Save).
func WithFoldHook(o Options, f func(step string)) Options {
	if o.hooks == nil {
		o.hooks = &testHooks{}
	}
	h := *o.hooks
	h.foldStep = f
	o.hooks = &h
	return o
}

// FoldOutstanding reports whether a handed-over epoch is not reaped yet.
func (l *Log) FoldOutstanding() bool {
	l.wmu.Lock()
	defer l.wmu.Unlock()
	return l.folding != nil
}

// OnDiskThrough is the last index a raft.db read finds now.
func (l *Log) OnDiskThrough() uint64 {
	l.mu.RLock()
	defer l.mu.RUnlock()
	return l.onDiskThroughLocked()
}
