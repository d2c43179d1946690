package store

import (
	"errors"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

func TestValidateCatalogCommands(t *testing.T) {
	big := strings.Repeat("x", 513)
	reg := func(f func(r *lodestonepb.CatalogRegisterRequest)) *lodestonepb.Command {
		c := regSvc("n1", "web-1", "web")
		c.GetCatalogRegister().Checks = []*lodestonepb.Check{{CheckId: "c1", ServiceId: "web-1"}}
		f(c.GetCatalogRegister())
		return at(t0, c)
	}
	sess := func(f func(s *lodestonepb.SessionEntry)) *lodestonepb.Command {
		c := sessCreate(sid(1), "n1")
		f(c.GetSessionCreate().Session)
		return at(t0, c)
	}
	tests := []struct {
		name     string
		cmd      *lodestonepb.Command
		wantRule string // "" means valid
		wantMsg  string
	}{
		{name: "register ok", cmd: reg(func(*lodestonepb.CatalogRegisterRequest) {})},
		{name: "register without time", cmd: at(0, regNode("n1")), wantRule: RuleCommandTime,
			wantMsg: "command has no time_unix_nano; the proposing server must stamp catalog, session and lock commands with its clock"},
		{name: "register without request", cmd: &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{}}, wantRule: RuleCommandOp,
			wantMsg: "catalog_register command has no request"},
		{name: "register without node", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Node = nil }), wantRule: RuleNameNonEmpty,
			wantMsg: "node.name must not be empty"},
		{name: "node name with NUL", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Node.Name = "n\x001" }), wantRule: RuleNameNoNUL,
			wantMsg: "node.name must not contain a NUL byte (found at byte 1)"},
		{name: "node name too long", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Node.Name = big; r.Checks = nil }), wantRule: RuleMaxNameBytes,
			wantMsg: "node.name is 513 bytes; at most 512 allowed (limit max-name-bytes)"},
		{name: "node without address", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Node.Address = "" }), wantRule: RuleNodeAddress,
			wantMsg: "node.address must not be empty unless skip_node_update is set (Consul: Must provide address)"},
		{name: "skip node update needs no address", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Node.Address, r.SkipNodeUpdate = "", true })},
		{name: "node id not a UUID", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Node.Id = "abc" }), wantRule: RuleUUID,
			wantMsg: `node.id "abc" is not a UUID (want 8-4-4-4-12 hex digits)`},
		{name: "node meta key", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) {
			r.Node.Meta = map[string]string{"ok": "1", "bad key": "2"}
		}), wantRule: RuleMeta,
			wantMsg: `node.meta key "bad key" is invalid; want 1 to 128 of A-Z a-z 0-9 _ -`},
		{name: "service meta value", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Service.Meta = map[string]string{"k": big} }), wantRule: RuleMeta,
			wantMsg: `service.meta value of "k" is 513 bytes; at most 512 allowed`},
		{name: "service without name", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Service.Name = "" }), wantRule: RuleNameNonEmpty,
			wantMsg: "service.name must not be empty"},
		{name: "service port", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Service.Port = 70000 }), wantRule: RulePort,
			wantMsg: "service.port 70000 is not a port; want 0 to 65535"},
		{name: "service weights", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Service.Weights = &lodestonepb.Weights{} }), wantRule: RuleWeights,
			wantMsg: "service.weights are passing=0 warning=0; want passing >= 1 and warning >= 0"},
		{name: "check without id or name", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Checks[0].CheckId = "" }), wantRule: RuleNameNonEmpty,
			wantMsg: "checks[0] needs check_id or name"},
		{name: "check of another node", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Checks[0].Node = "n2" }), wantRule: RuleCheckNode,
			wantMsg: `checks[0].node is "n2"; the checks of a registration belong to its node "n1"`},
		{name: "check status unknown", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Checks[0].Status = 9 }), wantRule: RuleHealthStatus,
			wantMsg: "checks[0].status 9 is not a health status; want HEALTH_PASSING, HEALTH_WARNING or HEALTH_CRITICAL (or unset: critical)"},
		{name: "check output too large", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Checks[0].Output = strings.Repeat("o", 512<<10+1) }),
			wantRule: RuleMaxValueBytes, wantMsg: "check output is 524289 bytes; at most 524288 allowed (limit max-value-bytes)"},
		{name: "nil check", cmd: reg(func(r *lodestonepb.CatalogRegisterRequest) { r.Checks = append(r.Checks, nil) }), wantRule: RuleCommandOp,
			wantMsg: "checks[1] is empty"},

		{name: "deregister ok", cmd: at(t0, dereg("n1", "s", "c"))},
		{name: "deregister without node", cmd: at(t0, dereg("", "s", "")), wantRule: RuleNameNonEmpty, wantMsg: "node must not be empty"},
		{name: "check update ok", cmd: at(t0, checkUpd("n1", "c", WARNING, "x"))},
		{name: "check update without status", cmd: at(t0, checkUpd("n1", "c", ANY, "")), wantRule: RuleHealthStatus,
			wantMsg: "status 0 is not a health status; want HEALTH_PASSING, HEALTH_WARNING or HEALTH_CRITICAL"},
		{name: "check update without check", cmd: at(t0, checkUpd("n1", "", PASSING, "")), wantRule: RuleNameNonEmpty, wantMsg: "check_id must not be empty"},

		{name: "session ok", cmd: sess(func(s *lodestonepb.SessionEntry) { s.Ttl = durationpb.New(10 * time.Second) })},
		{name: "session id not a UUID", cmd: sess(func(s *lodestonepb.SessionEntry) { s.Id = "s1" }), wantRule: RuleUUID,
			wantMsg: `session.id "s1" is not a UUID (want 8-4-4-4-12 hex digits)`},
		{name: "session without id", cmd: sess(func(s *lodestonepb.SessionEntry) { s.Id = "" }), wantRule: RuleNameNonEmpty,
			wantMsg: "session.id must not be empty"},
		{name: "session without node", cmd: sess(func(s *lodestonepb.SessionEntry) { s.Node = "" }), wantRule: RuleNameNonEmpty,
			wantMsg: "session.node must not be empty"},
		{name: "session ttl too short", cmd: sess(func(s *lodestonepb.SessionEntry) { s.Ttl = durationpb.New(time.Second) }), wantRule: RuleSessionTTL,
			wantMsg: "session.ttl is 1s; want 0 (none) or between 10s and 24h0m0s"},
		{name: "session ttl negative", cmd: sess(func(s *lodestonepb.SessionEntry) { s.Ttl = durationpb.New(-time.Second) }), wantRule: RuleDuration,
			wantMsg: "session.ttl is not a valid non-negative duration"},
		{name: "lock delay too long", cmd: sess(func(s *lodestonepb.SessionEntry) { s.LockDelay = durationpb.New(2 * time.Minute) }), wantRule: RuleLockDelay,
			wantMsg: "session.lock_delay is 2m0s; at most 1m0s allowed"},
		{name: "session behavior", cmd: sess(func(s *lodestonepb.SessionEntry) { s.Behavior = 7 }), wantRule: RuleSessionBehavior,
			wantMsg: "session.behavior 7 is unknown; want SESSION_RELEASE or SESSION_DELETE"},
		{name: "session empty check id", cmd: sess(func(s *lodestonepb.SessionEntry) { s.Checks = []string{""} }), wantRule: RuleNameNonEmpty,
			wantMsg: "session check id must not be empty"},
		{name: "session with store fields", cmd: sess(func(s *lodestonepb.SessionEntry) { s.CreateIndex = 3 }), wantRule: RuleUnusedField,
			wantMsg: "create_index, modify_index and renewed_unix_nano are set by the store; leave them unset"},
		{name: "destroy ok", cmd: at(t0, sessDestroy(sid(1)))},
		{name: "renew not a UUID", cmd: at(t0, sessRenew("x")), wantRule: RuleUUID, wantMsg: `id "x" is not a UUID (want 8-4-4-4-12 hex digits)`},
		{name: "invalidate nothing", cmd: at(t0, sessInvalidate("", 0)), wantRule: RuleInvalidateTarget,
			wantMsg: "session_invalidate names no session ids and no node"},
		{name: "invalidate by node ok", cmd: at(t0, sessInvalidate("n1", 0))},

		{name: "acquire ok", cmd: at(t0, acquireCmd("k", "v", sid(1)))},
		{name: "acquire without time", cmd: acquireCmd("k", "v", sid(1)), wantRule: RuleCommandTime,
			wantMsg: "command has no time_unix_nano; the proposing server must stamp catalog, session and lock commands with its clock"},
		{name: "release needs no time", cmd: releaseCmd("k", "v", sid(1))},
		{name: "acquire without session", cmd: at(t0, acquireCmd("k", "v", "")), wantRule: RuleLockSession, wantMsg: "acquire needs a session"},
		{name: "acquire and release", cmd: func() *lodestonepb.Command {
			c := at(t0, acquireCmd("k", "v", sid(1)))
			c.GetPut().Release = true
			return c
		}(), wantRule: RuleLockExclusive, wantMsg: "a put cannot both acquire and release; send one of them"},
		{name: "session without acquire", cmd: func() *lodestonepb.Command {
			c := putCmd("k", "v")
			c.GetPut().Session = sid(1)
			return c
		}(), wantRule: RuleUnusedField, wantMsg: "session is only used with acquire or release"},
		{name: "txn lock ok", cmd: at(t0, txnCmd(opLock(LOCK, "k", "v", sid(1)), opLock(UNLOCK, "j", "", sid(1)), opLock(CHECK_SESSION, "k", "", "")))},
		{name: "txn lock without time", cmd: txnCmd(opLock(LOCK, "k", "v", sid(1))), wantRule: RuleCommandTime,
			wantMsg: "command has no time_unix_nano; the proposing server must stamp catalog, session and lock commands with its clock"},
		{name: "txn lock without session", cmd: at(t0, txnCmd(opSet("a", ""), opLock(LOCK, "k", "v", ""))), wantRule: RuleLockSession,
			wantMsg: "txn op 1: LOCK needs a session"},
		{name: "txn session on SET", cmd: txnCmd(opLock(SET, "k", "v", sid(1))), wantRule: RuleUnusedField,
			wantMsg: "txn op 0: session is not used by SET; only LOCK, UNLOCK and CHECK_SESSION use it"},
		{name: "txn value on CHECK_SESSION", cmd: txnCmd(opLock(CHECK_SESSION, "k", "v", sid(1))), wantRule: RuleUnusedField,
			wantMsg: "txn op 0: value is not used by CHECK_SESSION; only SET, CAS, LOCK and UNLOCK write values"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := DefaultLimits().ValidateCommand(tt.cmd)
			if tt.wantRule == "" {
				if err != nil {
					t.Fatalf("ValidateCommand = %v, want nil", err)
				}
				return
			}
			var ie *InvalidError
			if !errors.As(err, &ie) || !errors.Is(err, ErrInvalid) {
				t.Fatalf("ValidateCommand = %v, want an *InvalidError", err)
			}
			if got, want := ie.Rule, tt.wantRule; got != want {
				t.Errorf("rule = %q, want %q", got, want)
			}
			if got, want := err.Error(), tt.wantMsg; got != want {
				t.Errorf("message = %q\nwant      %q", got, want)
			}
			// What CheckCommand refuses, Apply refuses too, changing
			// nothing but the index.
			if CheckCommand(tt.cmd) != nil {
				c := newClock(t)
				c.ok(regSvc("n1", "web-1", "web"))
				before := dump(c.s) + dumpCatalog(c.s)
				res, evs := c.s.Apply(2, tt.cmd)
				malformed := res.Result == nil
				if tt.cmd.GetTxn() != nil {
					malformed = res.GetTxn() != nil && !res.GetTxn().Succeeded
				}
				if !malformed || len(evs) != 0 {
					t.Errorf("Apply of a malformed command: %v, events %q", res, evKeys(evs))
				}
				if got := dump(c.s) + dumpCatalog(c.s); got != strings.Replace(before, "index=1", "index=2", 1) {
					t.Errorf("Apply of a malformed command changed the state")
				}
			}
		})
	}
}

func TestLimitsMaxNameBytes(t *testing.T) {
	l := Limits{MaxNameBytes: 4}
	if err := l.ValidateCommand(at(t0, regNode("n1234"))); err == nil || !strings.Contains(err.Error(), "at most 4 allowed (limit max-name-bytes)") {
		t.Errorf("ValidateCommand = %v", err)
	}
	if err := (Limits{MaxNameBytes: 1 << 20}).Validate(); err == nil || !strings.Contains(err.Error(), "MaxNameBytes") {
		t.Errorf("Validate = %v, want MaxNameBytes refused", err)
	}
}
