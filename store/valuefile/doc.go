// Package valuefile keeps the store's values outside the Go heap: in slots
// of a file the process writes with pwrite and reads through a read-only
// mapping (mapping.go; pread where there is none), so value bytes live in
// the kernel's page cache instead of the Go heap, and the garbage
// collector neither scans nor counts them.
//
// The need is measured: with a million keys of 256 B, the values were half
// of a member's live heap, and the collector lets the heap grow to twice
// what is live, so a member held about twice etcd's resident memory, which
// keeps its values in bbolt's file.
//
// # Contract
//
// A File hands out a Ref for each value Put into it and reads the bytes
// back with Read. One goroutine (the store's apply goroutine, holding the
// store's write lock) calls Put, Free and Pin; any number of goroutines
// call Read concurrently with them, and an unpin function may be called
// from any goroutine.
//
// A Ref stays readable until it is freed, and longer while a pin taken
// before the Free is held: a store snapshot pins the File so that values
// its frozen B-tree still names are not overwritten while it is encoded.
// Reading a freed Ref that no pin protects returns whatever the slot holds
// by then; the store never does.
//
// # Layout
//
// The file is a heap of slots. A value of n bytes takes a slot of its size
// class: n rounded up to a multiple of an eighth of the power of two below
// it (16 B at least), so a slot wastes at most an eighth of what it holds.
// A freed slot goes on its class's free list and the next Put of that class
// reuses it; a Put with no free slot of its class appends one at the end.
// The file never shrinks: it holds the peak of each class, as bbolt's file
// holds its peak. Free lists live in memory, 8 bytes per free slot.
//
// # Bases
//
// A restore need not copy its values: a Base is a read-only file that
// already holds them, the snapshot file the store was restored from, and a
// Ref may point into it (AddBase, BaseRef). Its values are freed like any
// other, but their room is not reused; the File closes the base when its
// last value is freed. Until then the snapshot's disk space stays in use
// even after the Raft log removes the file from its directory.
//
// # Failures
//
// The file is derived state, not a record: it is truncated when opened,
// never synced, and rebuilt by the store from its snapshot and the Raft
// log after a restart. A crash loses nothing that was acknowledged. A
// failed pwrite leaves the slot unused and is returned to the caller; a
// failed or short pread is returned as an error naming the Ref. A read
// through the mapping cannot return an error: a read error of the device
// faults the process (SIGBUS), as a failed pread panics the store, and a
// file another process truncated reads as zeros up to the end of its last
// page and faults past it. The file is the process's own, so only an
// operator's mistake truncates it.
package valuefile
