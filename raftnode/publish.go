package raftnode

import (
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

// toWatchEvents converts the store's events of one applied entry for the
// hub. The hub owns the result; the store's entries are immutable, so
// values are shared, not copied.
func toWatchEvents(evs []store.Event) []watch.Event {
	if len(evs) == 0 {
		return nil
	}
	out := make([]watch.Event, len(evs))
	for i, ev := range evs {
		out[i].KV = watchKV(ev.KV, string(ev.KV.Key))
		out[i].Type = watch.Put
		if ev.Type == store.EventDelete {
			out[i].Type = watch.Delete
		}
		if ev.PrevKV != nil {
			// NB: one key string for both: the hub retains 100k events
			// by default, and each string is an object every GC cycle
			// marks.
			key := out[i].KV.Key
			if string(ev.PrevKV.Key) != key {
				key = string(ev.PrevKV.Key)
			}
			prev := watchKV(ev.PrevKV, key)
			out[i].PrevKV = &prev
		}
	}
	return out
}

// watchKV is kv for the hub with key, kv.Key as a string.
func watchKV(kv *lodestonepb.KeyValue, key string) watch.KeyValue {
	return watch.KeyValue{
		Key: key, Value: kv.Value, CreateIndex: kv.CreateIndex, ModifyIndex: kv.ModifyIndex,
		LockIndex: kv.LockIndex, Flags: kv.Flags, Session: kv.Session,
	}
}
