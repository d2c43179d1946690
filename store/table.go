package store

import (
	"strings"

	"github.com/google/btree"
)

// table is an ordered map from string keys to immutable values, on a
// copy-on-write B-tree so Store.Snapshot can freeze it in O(1). Values are
// never modified in place: a write replaces the pointer.
//
// Composite keys join their parts with a NUL byte (compositeKey), which no
// name may contain, so (node, id) pairs sort by node, then id, and a
// node's rows form the key range with prefix node+"\x00".
type table[T any] struct {
	t *btree.BTreeG[entry[T]]
}

type entry[T any] struct {
	key string
	v   T
}

func newTable[T any]() table[T] {
	return table[T]{t: btree.NewG(btreeDegree, func(a, b entry[T]) bool { return a.key < b.key })}
}

func (t table[T]) get(key string) (T, bool) {
	e, ok := t.t.Get(entry[T]{key: key})
	return e.v, ok
}

func (t table[T]) set(key string, v T) { t.t.ReplaceOrInsert(entry[T]{key: key, v: v}) }

func (t table[T]) del(key string) (T, bool) {
	e, ok := t.t.Delete(entry[T]{key: key})
	return e.v, ok
}

func (t table[T]) len() int { return t.t.Len() }

// clone returns a copy-on-write copy; see btree.BTreeG.Clone. It must not
// run concurrently with a write (the store's write lock guarantees it).
func (t table[T]) clone() table[T] { return table[T]{t: t.t.Clone()} }

// ascend calls fn for every row in key order until fn returns false.
func (t table[T]) ascend(fn func(key string, v T) bool) {
	t.t.Ascend(func(e entry[T]) bool { return fn(e.key, e.v) })
}

// ascendPrefix calls fn, in key order, for every row whose key starts with
// prefix, until fn returns false.
func (t table[T]) ascendPrefix(prefix string, fn func(key string, v T) bool) {
	t.t.AscendGreaterOrEqual(entry[T]{key: prefix}, func(e entry[T]) bool {
		if !strings.HasPrefix(e.key, prefix) {
			return false
		}
		return fn(e.key, e.v)
	})
}

// keysWithPrefix returns the keys starting with prefix, in order. Callers
// that delete rows collect first: a B-tree must not change while it is
// iterated.
func (t table[T]) keysWithPrefix(prefix string) []string {
	var keys []string
	t.ascendPrefix(prefix, func(k string, _ T) bool {
		keys = append(keys, k)
		return true
	})
	return keys
}

// compositeKey joins parts with NUL; see table.
func compositeKey(parts ...string) string { return strings.Join(parts, "\x00") }

// under returns the key prefix of every row whose first part is part.
func under(part string) string { return part + "\x00" }
