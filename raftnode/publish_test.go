package raftnode

import (
	"reflect"
	"testing"
	"unsafe"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
	"github.com/lodestone-kv/lodestone/watch"
)

func TestWatchEventsShareTheKey(t *testing.T) {
	prev := &lodestonepb.KeyValue{Key: []byte("a/1"), Value: []byte("old"), CreateIndex: 3, ModifyIndex: 4}
	cur := &lodestonepb.KeyValue{Key: []byte("a/1"), Value: []byte("new"), CreateIndex: 3, ModifyIndex: 9, LockIndex: 1, Flags: 42, Session: "s"}
	other := &lodestonepb.KeyValue{Key: []byte("b"), ModifyIndex: 2}
	got := toWatchEvents([]store.Event{
		{Type: store.EventPut, KV: cur, PrevKV: prev},
		{Type: store.EventDelete, KV: &lodestonepb.KeyValue{Key: []byte("a/2"), ModifyIndex: 9}, PrevKV: other},
	})
	want := []watch.Event{
		{Type: watch.Put, KV: watch.KeyValue{Key: "a/1", Value: []byte("new"), CreateIndex: 3, ModifyIndex: 9, LockIndex: 1, Flags: 42, Session: "s"},
			PrevKV: &watch.KeyValue{Key: "a/1", Value: []byte("old"), CreateIndex: 3, ModifyIndex: 4}},
		{Type: watch.Delete, KV: watch.KeyValue{Key: "a/2", ModifyIndex: 9}, PrevKV: &watch.KeyValue{Key: "b", ModifyIndex: 2}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("toWatchEvents:\n got %+v\nwant %+v", got, want)
	}
	if unsafe.StringData(got[0].PrevKV.Key) != unsafe.StringData(got[0].KV.Key) {
		t.Fatal("the PrevKV of a put holds a second copy of its key")
	}
}
