package store

import (
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Catalog and session validation: the structural check* functions (part of
// CheckCommand, enforced by Apply) and the Limits rules (ValidateCommand
// only).

// Meta limits, as Consul's (structs.ValidateMetadata).
const (
	maxMetaPairs      = 64
	maxMetaKeyBytes   = 128
	maxMetaValueBytes = 512
)

func checkPut(p *lodestonepb.PutRequest) error {
	if err := checkKey(-1, p.Key); err != nil {
		return err
	}
	if p.Acquire && p.Release {
		return invalid(-1, "acquire", RuleLockExclusive, "a put cannot both acquire and release; send one of them")
	}
	if (p.Acquire || p.Release) && p.Session == "" {
		verb := "acquire"
		if p.Release {
			verb = "release"
		}
		return invalid(-1, "session", RuleLockSession, "%s needs a session", verb)
	}
	return nil
}

// checkName refuses a NUL byte in v, and an empty v when required.
func checkName(field, v string, required bool) error {
	if v == "" {
		if required {
			return invalid(-1, field, RuleNameNonEmpty, "%s must not be empty", field)
		}
		return nil
	}
	if i := strings.IndexByte(v, 0); i >= 0 {
		return invalid(-1, field, RuleNameNoNUL, "%s must not contain a NUL byte (found at byte %d)", field, i)
	}
	return nil
}

func checkStatus(field string, st lodestonepb.HealthStatus, allowUnspecified bool) error {
	if _, known := lodestonepb.HealthStatus_name[int32(st)]; !known ||
		(!allowUnspecified && st == lodestonepb.HealthStatus_HEALTH_STATUS_UNSPECIFIED) {
		want := "HEALTH_PASSING, HEALTH_WARNING or HEALTH_CRITICAL"
		if allowUnspecified {
			want += " (or unset: critical)"
		}
		return invalid(-1, field, RuleHealthStatus, "%s %d is not a health status; want %s", field, int32(st), want)
	}
	return nil
}

func checkRegister(r *lodestonepb.CatalogRegisterRequest) error {
	if r == nil {
		return invalid(-1, "command", RuleCommandOp, "catalog_register command has no request")
	}
	if err := checkName("node.name", r.GetNode().GetName(), true); err != nil {
		return err
	}
	if s := r.Service; s != nil {
		if err := checkName("service.name", s.Name, true); err != nil {
			return err
		}
		if err := checkName("service.id", s.Id, false); err != nil {
			return err
		}
	}
	for i, c := range r.Checks {
		f := func(n string) string { return "checks[" + itoa(i) + "]" + n }
		if c == nil {
			return invalid(-1, f(""), RuleCommandOp, "%s is empty", f(""))
		}
		if c.CheckId == "" && c.Name == "" {
			return invalid(-1, f(".check_id"), RuleNameNonEmpty, "%s needs check_id or name", f(""))
		}
		for _, n := range []struct{ field, v string }{{".check_id", c.CheckId}, {".name", c.Name}, {".service_id", c.ServiceId}} {
			if err := checkName(f(n.field), n.v, false); err != nil {
				return err
			}
		}
		if c.Node != "" && c.Node != r.Node.Name {
			return invalid(-1, f(".node"), RuleCheckNode,
				"%s is %q; the checks of a registration belong to its node %q", f(".node"), c.Node, r.Node.Name)
		}
		if err := checkStatus(f(".status"), c.Status, true); err != nil {
			return err
		}
	}
	return nil
}

func checkDeregister(d *lodestonepb.CatalogDeregisterRequest) error {
	if d == nil {
		return invalid(-1, "command", RuleCommandOp, "catalog_deregister command has no request")
	}
	if err := checkName("node", d.Node, true); err != nil {
		return err
	}
	if err := checkName("service_id", d.ServiceId, false); err != nil {
		return err
	}
	return checkName("check_id", d.CheckId, false)
}

func checkCheckUpdate(u *lodestonepb.UpdateCheckRequest) error {
	if u == nil {
		return invalid(-1, "command", RuleCommandOp, "check_update command has no request")
	}
	if err := checkName("node", u.Node, true); err != nil {
		return err
	}
	if err := checkName("check_id", u.CheckId, true); err != nil {
		return err
	}
	return checkStatus("status", u.Status, false)
}

func checkSessionID(id string) error { return checkName("id", id, true) }

func checkSessionCreate(r *lodestonepb.CreateSessionRequest) error {
	if r == nil || r.Session == nil {
		return invalid(-1, "command", RuleCommandOp, "session_create command has no session")
	}
	s := r.Session
	if err := checkName("session.id", s.Id, true); err != nil {
		return err
	}
	if err := checkName("session.node", s.Node, true); err != nil {
		return err
	}
	for i, sc := range s.ServiceChecks {
		if sc == nil {
			return invalid(-1, "session.service_checks", RuleCommandOp, "session.service_checks[%d] is empty", i)
		}
	}
	for _, c := range sessionCheckIDs(s) {
		if err := checkName("session check id", c, true); err != nil {
			return err
		}
	}
	if _, known := lodestonepb.SessionBehavior_name[int32(s.Behavior)]; !known {
		return invalid(-1, "session.behavior", RuleSessionBehavior,
			"session.behavior %d is unknown; want SESSION_RELEASE or SESSION_DELETE", int32(s.Behavior))
	}
	return nil
}

func checkSessionInvalidate(v *lodestonepb.SessionInvalidate) error {
	if v == nil {
		return invalid(-1, "command", RuleCommandOp, "session_invalidate command has no request")
	}
	if len(v.Ids) == 0 && v.Node == "" {
		return invalid(-1, "ids", RuleInvalidateTarget, "session_invalidate names no session ids and no node")
	}
	for _, id := range v.Ids {
		if err := checkName("ids", id, true); err != nil {
			return err
		}
	}
	return checkName("node", v.Node, false)
}

func itoa(i int) string {
	var b [20]byte
	n := len(b)
	for {
		n--
		b[n] = byte('0' + i%10)
		i /= 10
		if i == 0 {
			return string(b[n:])
		}
	}
}

// --- limits ----------------------------------------------------------------

type name struct{ field, v string }

// names checks MaxNameBytes for every name.
func (l Limits) names(ns ...name) error {
	for _, n := range ns {
		if len(n.v) > l.MaxNameBytes {
			return invalid(-1, n.field, RuleMaxNameBytes,
				"%s is %d bytes; at most %d allowed (limit max-name-bytes)", n.field, len(n.v), l.MaxNameBytes)
		}
	}
	return nil
}

func (l Limits) validateOutput(out string) error {
	if len(out) > l.MaxValueBytes {
		return invalid(-1, "output", RuleMaxValueBytes,
			"check output is %d bytes; at most %d allowed (limit max-value-bytes)", len(out), l.MaxValueBytes)
	}
	return nil
}

// validateUUID checks a Consul-style UUID: 8-4-4-4-12 hex digits.
func validateUUID(field, v string) error {
	ok := len(v) == 36
	for i := 0; ok && i < len(v); i++ {
		c := v[i]
		switch i {
		case 8, 13, 18, 23:
			ok = c == '-'
		default:
			ok = ('0' <= c && c <= '9') || ('a' <= c && c <= 'f') || ('A' <= c && c <= 'F')
		}
	}
	if !ok {
		return invalid(-1, field, RuleUUID, "%s %q is not a UUID (want 8-4-4-4-12 hex digits)", field, v)
	}
	return nil
}

func validateMeta(field string, m map[string]string) error {
	if len(m) > maxMetaPairs {
		return invalid(-1, field, RuleMeta, "%s has %d pairs; at most %d allowed", field, len(m), maxMetaPairs)
	}
	for _, k := range sortedKeys(m) {
		if k == "" || len(k) > maxMetaKeyBytes || strings.IndexFunc(k, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' || r == '-')
		}) >= 0 {
			return invalid(-1, field, RuleMeta,
				"%s key %q is invalid; want 1 to %d of A-Z a-z 0-9 _ -", field, k, maxMetaKeyBytes)
		}
		if v := m[k]; len(v) > maxMetaValueBytes {
			return invalid(-1, field, RuleMeta, "%s value of %q is %d bytes; at most %d allowed", field, k, len(v), maxMetaValueBytes)
		}
	}
	return nil
}

func validatePort(field string, p uint32) error {
	if p > 65535 {
		return invalid(-1, field, RulePort, "%s %d is not a port; want 0 to 65535", field, p)
	}
	return nil
}

func (l Limits) validateRegister(r *lodestonepb.CatalogRegisterRequest) error {
	n := r.Node
	if err := l.names(name{"node.name", n.Name}); err != nil {
		return err
	}
	if !r.SkipNodeUpdate {
		if n.Id != "" {
			if err := validateUUID("node.id", n.Id); err != nil {
				return err
			}
		}
		if n.Address == "" {
			return invalid(-1, "node.address", RuleNodeAddress,
				"node.address must not be empty unless skip_node_update is set (Consul: Must provide address)")
		}
		if err := validateMeta("node.meta", n.Meta); err != nil {
			return err
		}
	}
	if s := r.Service; s != nil {
		if err := l.names(name{"service.name", s.Name}, name{"service.id", s.Id}); err != nil {
			return err
		}
		for _, t := range s.Tags {
			if err := l.names(name{"service.tags", t}); err != nil {
				return err
			}
		}
		if err := validatePort("service.port", s.Port); err != nil {
			return err
		}
		for _, k := range sortedKeys(s.TaggedAddresses) {
			if err := validatePort("service.tagged_addresses["+k+"].port", s.TaggedAddresses[k].GetPort()); err != nil {
				return err
			}
		}
		if w := s.Weights; w != nil && (w.Passing < 1 || w.Warning < 0) {
			return invalid(-1, "service.weights", RuleWeights,
				"service.weights are passing=%d warning=%d; want passing >= 1 and warning >= 0", w.Passing, w.Warning)
		}
		if err := validateMeta("service.meta", s.Meta); err != nil {
			return err
		}
	}
	for i, c := range r.Checks {
		p := "checks[" + itoa(i) + "]"
		if err := l.names(name{p + ".check_id", c.CheckId}, name{p + ".name", c.Name}, name{p + ".service_id", c.ServiceId}); err != nil {
			return err
		}
		if err := l.validateOutput(c.Output); err != nil {
			return err
		}
	}
	return nil
}

func validDuration(field string, d *durationpb.Duration) (time.Duration, error) {
	if d == nil {
		return 0, nil
	}
	if err := d.CheckValid(); err != nil || d.AsDuration() < 0 {
		return 0, invalid(-1, field, RuleDuration, "%s is not a valid non-negative duration", field)
	}
	return d.AsDuration(), nil
}

func (l Limits) validateSession(s *lodestonepb.SessionEntry) error {
	if err := validateUUID("session.id", s.Id); err != nil {
		return err
	}
	ns := []name{{"session.node", s.Node}, {"session.name", s.Name}}
	for _, c := range sessionCheckIDs(s) {
		ns = append(ns, name{"session check id", c})
	}
	if err := l.names(ns...); err != nil {
		return err
	}
	ttl, err := validDuration("session.ttl", s.Ttl)
	if err != nil {
		return err
	}
	if ttl != 0 && (ttl < SessionTTLMin || ttl > SessionTTLMax) {
		return invalid(-1, "session.ttl", RuleSessionTTL,
			"session.ttl is %v; want 0 (none) or between %v and %v", ttl, SessionTTLMin, SessionTTLMax)
	}
	delay, err := validDuration("session.lock_delay", s.LockDelay)
	if err != nil {
		return err
	}
	if delay > MaxLockDelay {
		return invalid(-1, "session.lock_delay", RuleLockDelay,
			"session.lock_delay is %v; at most %v allowed", delay, MaxLockDelay)
	}
	if s.CreateIndex != 0 || s.ModifyIndex != 0 || s.RenewedUnixNano != 0 {
		return invalid(-1, "session", RuleUnusedField,
			"create_index, modify_index and renewed_unix_nano are set by the store; leave them unset")
	}
	return nil
}
