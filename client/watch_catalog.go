package client

import (
	"fmt"
	"strings"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// ServiceInstanceEvent is a decoded catalog service-instance event.
type ServiceInstanceEvent struct {
	Service, Node, ID string // the instance's service name, node and service id
	// Index is the index of the change.
	Index uint64
	// Health is the instance with its node, the checks that count for it
	// and their aggregated status; nil when the instance was deregistered.
	Health *lodestonepb.ServiceHealth
}

// serviceEventPrefix is the key prefix of catalog service-instance events
// (store.ServiceEventPrefix; see WATCH_TARGET_CATALOG_SERVICES).
const serviceEventPrefix = "\x00catalog/service/"

// DecodeServiceInstanceEvent decodes one event of a WatchCatalogServices
// watch. The result shares nothing with ev.
func DecodeServiceInstanceEvent(ev *lodestonepb.Event) (ServiceInstanceEvent, error) {
	key := string(ev.GetKv().GetKey())
	rest, ok := strings.CutPrefix(key, serviceEventPrefix)
	parts := strings.Split(rest, "\x00")
	if !ok || len(parts) != 3 || parts[0] == "" || parts[2] == "" {
		return ServiceInstanceEvent{}, fmt.Errorf("client: %q is not a service-instance event key", key)
	}
	out := ServiceInstanceEvent{Service: parts[0], Node: parts[1], ID: parts[2], Index: ev.GetKv().GetModifyIndex()}
	if ev.GetType() == lodestonepb.Event_PUT {
		out.Health = &lodestonepb.ServiceHealth{}
		if err := proto.Unmarshal(ev.GetKv().GetValue(), out.Health); err != nil {
			return ServiceInstanceEvent{}, fmt.Errorf("client: decode service-instance event %s/%s/%s: %w", parts[0], parts[1], parts[2], err)
		}
	}
	return out, nil
}
