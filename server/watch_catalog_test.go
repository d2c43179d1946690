package server

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/store"
)

// A WATCH_TARGET_CATALOG_SERVICES watch delivers the catalog's
// service-instance events (all services, or one, and replayed from a start
// index); a user watch on every key never sees them, and a user key cannot
// name the reserved namespace.
func TestWatchCatalogServices(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	cat := lodestonepb.NewCatalogClient(c.conn(lead))
	before := put(t, c.kv(lead), "before", "x").Header.Index

	all := openWatch(t, c, lead)
	all.create(&lodestonepb.WatchCreate{WatchId: 1, Target: lodestonepb.WatchTarget_WATCH_TARGET_CATALOG_SERVICES})
	web := openWatch(t, c, lead)
	web.create(&lodestonepb.WatchCreate{WatchId: 1, Key: []byte("web"), Target: lodestonepb.WatchTarget_WATCH_TARGET_CATALOG_SERVICES})
	user := openWatch(t, c, lead)
	user.create(&lodestonepb.WatchCreate{WatchId: 1, Prefix: true})

	for _, svc := range []string{"web2", "web"} {
		if _, err := cat.Register(ctxT(t), &lodestonepb.CatalogRegisterRequest{
			Node:    &lodestonepb.Node{Name: "n1", Address: "10.0.0.1"},
			Service: &lodestonepb.Service{Id: svc + "-1", Name: svc, Port: 80},
		}); err != nil {
			t.Fatal(err)
		}
	}
	put(t, c.kv(lead), "k", "v")

	if evs, _ := user.collect(1); string(evs[0].Kv.Key) != "k" {
		t.Errorf("user watch on every key got %q first, want k (reserved keys filtered out)", evs[0].Kv.Key)
	}
	evs, _ := all.collect(2)
	if got, want := string(evs[1].Kv.Key), string(store.ServiceInstanceEventKey("web", "n1", "web-1")); got != want {
		t.Errorf("catalog watch event key %q, want %q", got, want)
	}
	var h lodestonepb.ServiceHealth
	if err := proto.Unmarshal(evs[1].Kv.Value, &h); err != nil || h.Service.GetName() != "web" || h.Node.GetAddress() != "10.0.0.1" ||
		h.Status != lodestonepb.HealthStatus_HEALTH_PASSING {
		t.Errorf("catalog event value %v (err %v), want web on n1, passing", &h, err)
	}
	if evs, _ := web.collect(1); !strings.HasSuffix(string(evs[0].Kv.Key), "web-1") {
		t.Errorf("watch of service web got %q, want only web's instance (not web2's)", evs[0].Kv.Key)
	}

	// Resume from an index: the history is replayed.
	again := openWatch(t, c, lead)
	again.create(&lodestonepb.WatchCreate{WatchId: 1, StartIndex: before, Target: lodestonepb.WatchTarget_WATCH_TARGET_CATALOG_SERVICES})
	if evs, _ := again.collect(2); len(evs) != 2 || evs[0].Kv.ModifyIndex <= before {
		t.Errorf("resumed catalog watch: %d events, want the 2 after index %d", len(evs), before)
	}

	for _, tc := range []struct {
		name string
		req  *lodestonepb.WatchCreate
	}{
		{"reserved prefix as a user key", &lodestonepb.WatchCreate{WatchId: 2, Key: []byte(store.ServiceEventPrefix), Prefix: true}},
		{"NUL in a user key", &lodestonepb.WatchCreate{WatchId: 2, Key: store.ServiceInstanceEventKey("web", "n1", "web-1")}},
		{"NUL in a service name", &lodestonepb.WatchCreate{WatchId: 2, Key: []byte("web\x00n1"), Target: lodestonepb.WatchTarget_WATCH_TARGET_CATALOG_SERVICES}},
		{"unknown target", &lodestonepb.WatchCreate{WatchId: 2, Key: []byte("k"), Target: 99}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := user.stream.Send(&lodestonepb.WatchRequest{Request: &lodestonepb.WatchRequest_Create{Create: tc.req}}); err != nil {
				t.Fatal(err)
			}
			if resp := user.recv(); !resp.Canceled || resp.WatchId != 2 {
				t.Fatalf("got %+v, want watch 2 refused", resp)
			}
		})
	}
}
