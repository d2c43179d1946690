package client

import (
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// DecodeServiceInstanceEvent reads the key layout of
// WATCH_TARGET_CATALOG_SERVICES (store.ServiceInstanceEventKey) and the
// ServiceHealth value, and refuses anything else.
func TestDecodeServiceInstanceEvent(t *testing.T) {
	h := &lodestonepb.ServiceHealth{Service: &lodestonepb.Service{Id: "w1", Name: "web", Port: 80},
		Status: lodestonepb.HealthStatus_HEALTH_PASSING}
	val, err := proto.Marshal(h)
	if err != nil {
		t.Fatal(err)
	}
	key := []byte("\x00catalog/service/web\x00n1\x00w1")
	put := &lodestonepb.Event{Kv: &lodestonepb.KeyValue{Key: key, Value: val, ModifyIndex: 7}}
	got, err := DecodeServiceInstanceEvent(put)
	if err != nil || got.Service != "web" || got.Node != "n1" || got.ID != "w1" || got.Index != 7 ||
		!proto.Equal(got.Health, h) {
		t.Errorf("put: %+v, %v; want web/n1/w1 at 7 with its health", got, err)
	}
	del := &lodestonepb.Event{Type: lodestonepb.Event_DELETE, Kv: &lodestonepb.KeyValue{Key: key, ModifyIndex: 8}}
	if got, err := DecodeServiceInstanceEvent(del); err != nil || got.Health != nil || got.Index != 8 {
		t.Errorf("delete: %+v, %v; want no health at 8", got, err)
	}
	for name, ev := range map[string]*lodestonepb.Event{
		"user key":      {Kv: &lodestonepb.KeyValue{Key: []byte("web/n1/w1")}},
		"node event":    {Kv: &lodestonepb.KeyValue{Key: []byte("\x00catalog/node/n1")}},
		"missing id":    {Kv: &lodestonepb.KeyValue{Key: []byte("\x00catalog/service/web\x00n1")}},
		"bad value":     {Kv: &lodestonepb.KeyValue{Key: key, Value: []byte{0xff}}},
		"empty service": {Kv: &lodestonepb.KeyValue{Key: []byte("\x00catalog/service/\x00n1\x00w1")}},
	} {
		if _, err := DecodeServiceInstanceEvent(ev); err == nil {
			t.Errorf("%s: decoded, want an error", name)
		}
	}
}
