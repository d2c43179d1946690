package store

import (
	"errors"
	"fmt"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// Catalog transactions: Consul's /v1/txn with Node, Service and Check
// operations beside KV ones, as one command. Every operation runs in
// order on the live state, each seeing the earlier ones' effects; if any
// fails, everything the command did is undone:
//
//   - KV changes by the KV undo log (applier.undo), which also restores
//     the keys sessions hold;
//   - the catalog, session and side tables by going back to a
//     copy-on-write clone taken before the first operation (O(1));
//   - the derived lookups that are B-trees (services by name) the same
//     way, and those that are plain maps (node ids, sessions by node and
//     check) by replaying derUndo, which the mutations of those maps
//     record while a catalog transaction runs.
//
// Readers never see the intermediate state: Apply holds the write lock.

// setNodeID records that node UUID id now belongs to name ("" removes
// it), keeping the change undoable inside a catalog transaction.
func (a *applier) setNodeID(id, name string) {
	if a.derUndo != nil {
		prev, had := a.s.der.nodeIDs[id]
		*a.derUndo = append(*a.derUndo, func() {
			if had {
				a.s.der.nodeIDs[id] = prev
			} else {
				delete(a.s.der.nodeIDs, id)
			}
		})
	}
	if name == "" {
		delete(a.s.der.nodeIDs, id)
		return
	}
	a.s.der.nodeIDs[id] = name
}

func (a *applier) catalogTxn(t *lodestonepb.CatalogTxnRequest) *lodestonepb.CommandResult {
	if checkCatalogTxn(t) != nil {
		return &lodestonepb.CommandResult{}
	}
	resp := &lodestonepb.CatalogTxnResponse{}
	res := &lodestonepb.CommandResult{Result: &lodestonepb.CommandResult_CatalogTxn{CatalogTxn: resp}}
	savedTab, savedByName := a.s.tab.clone(), a.s.der.servicesByName.clone()
	var undo []func()
	a.derUndo = &undo
	fail := func(i int, why string) {
		resp.Errors = append(resp.Errors, &lodestonepb.TxnError{OpIndex: uint32(i), What: why})
	}
	results := make([]*lodestonepb.CatalogTxnResult, 0, len(t.Ops))
	for i, op := range t.Ops {
		var r *lodestonepb.CatalogTxnResult
		switch o := op.Op.(type) {
		case *lodestonepb.MixedTxnOp_Kv:
			r = &lodestonepb.CatalogTxnResult{Kv: a.txnKVOp(i, o.Kv, fail)}
		case *lodestonepb.MixedTxnOp_Catalog:
			r = a.catalogTxnOp(i, o.Catalog, fail)
		}
		results = append(results, r)
	}
	a.derUndo = nil
	if len(resp.Errors) > 0 {
		a.undo()
		a.s.tab, a.s.der.servicesByName = savedTab, savedByName
		for i := len(undo) - 1; i >= 0; i-- {
			undo[i]()
		}
		a.cat = nil // NB: the events and index moves of what was undone
		return res
	}
	resp.Succeeded, resp.Results = true, results
	return res
}

// casHolds is Consul's check-and-set rule for catalog objects: index 0
// wants the object absent, any other its ModifyIndex.
func casHolds(exists bool, modifyIndex, want uint64) bool {
	if want == 0 {
		return !exists
	}
	return exists && modifyIndex == want
}

// catalogTxnOp runs one Node, Service or Check operation (op i) and
// returns its result: the object as stored after a GET, SET or CAS, an
// empty result after a delete or a failure.
func (a *applier) catalogTxnOp(i int, o *lodestonepb.CatalogTxnOp, fail func(int, string)) *lodestonepb.CatalogTxnResult {
	r := &lodestonepb.CatalogTxnResult{}
	t := &a.s.tab
	// apply runs the command the operation amounts to; a refusal by the
	// state (a missing node, a check of a missing service) fails the op.
	apply := func(res *lodestonepb.CommandResult) bool {
		switch {
		case res.Rejected != nil:
			fail(i, res.Rejected.Detail)
			return false
		case res.Result == nil: // NB: checkCatalogTxn refused it first
			fail(i, "malformed operation")
			return false
		}
		return true
	}
	node, id, what := catalogTxnTarget(o)
	var exists bool
	var modifyIndex uint64
	switch {
	case o.Node != nil:
		cur, ok := t.nodes.get(node)
		exists, modifyIndex, r.Node = ok, cur.GetModifyIndex(), cur
	case o.Service != nil:
		cur, ok := t.services.get(compositeKey(node, id))
		exists, modifyIndex, r.Service = ok, cur.GetModifyIndex(), cur
	default:
		cur, ok := t.checks.get(compositeKey(node, id))
		exists, modifyIndex, r.Check = ok, cur.GetModifyIndex(), cur
	}
	switch o.Verb {
	case lodestonepb.TxnOp_GET:
		if !exists {
			fail(i, fmt.Sprintf("%s doesn't exist", what))
			return &lodestonepb.CatalogTxnResult{}
		}
		return r
	case lodestonepb.TxnOp_CAS, lodestonepb.TxnOp_SET:
		if o.Verb == lodestonepb.TxnOp_CAS && !casHolds(exists, modifyIndex, o.Index) {
			fail(i, fmt.Sprintf("failed to set %s, index is stale", what))
			return &lodestonepb.CatalogTxnResult{}
		}
		if !apply(a.catalogRegister(catalogTxnRegister(o))) {
			return &lodestonepb.CatalogTxnResult{}
		}
		switch {
		case o.Node != nil:
			r.Node, _ = t.nodes.get(node)
		case o.Service != nil:
			r.Service, _ = t.services.get(compositeKey(node, id))
		default:
			r.Check, _ = t.checks.get(compositeKey(node, id))
		}
		return r
	default: // DELETE, DELETE_CAS
		if o.Verb == lodestonepb.TxnOp_DELETE_CAS && (!exists || modifyIndex != o.Index) {
			fail(i, fmt.Sprintf("failed to delete %s, index is stale", what))
			return &lodestonepb.CatalogTxnResult{}
		}
		apply(a.catalogDeregister(catalogTxnDeregister(o)))
		return &lodestonepb.CatalogTxnResult{}
	}
}

// catalogTxnTarget names what a catalog operation acts on: its node, its
// service or check id, and how Consul's errors name it.
func catalogTxnTarget(o *lodestonepb.CatalogTxnOp) (node, id, what string) {
	switch {
	case o.Node != nil:
		return o.Node.Name, "", fmt.Sprintf("node %q", o.Node.Name)
	case o.Service != nil:
		id = o.Service.Id
		if id == "" {
			id = o.Service.Name
		}
		return o.Service.Node, id, fmt.Sprintf("service %q on node %q", id, o.Service.Node)
	default:
		id = checkID(o.Check)
		return o.Check.Node, id, fmt.Sprintf("check %q on node %q", id, o.Check.Node)
	}
}

// catalogTxnRegister is the registration a SET or CAS amounts to: a node
// record, or a service or check on an existing node.
func catalogTxnRegister(o *lodestonepb.CatalogTxnOp) *lodestonepb.CatalogRegisterRequest {
	switch {
	case o.Node != nil:
		return &lodestonepb.CatalogRegisterRequest{Node: o.Node}
	case o.Service != nil:
		return &lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: o.Service.Node}, SkipNodeUpdate: true, Service: o.Service}
	default:
		return &lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: o.Check.Node}, SkipNodeUpdate: true,
			Checks: []*lodestonepb.Check{o.Check}}
	}
}

// catalogTxnDeregister is the deregistration a DELETE amounts to.
func catalogTxnDeregister(o *lodestonepb.CatalogTxnOp) *lodestonepb.CatalogDeregisterRequest {
	node, id, _ := catalogTxnTarget(o)
	switch {
	case o.Node != nil:
		return &lodestonepb.CatalogDeregisterRequest{Node: node}
	case o.Service != nil:
		return &lodestonepb.CatalogDeregisterRequest{Node: node, ServiceId: id}
	default:
		return &lodestonepb.CatalogDeregisterRequest{Node: node, CheckId: id}
	}
}

// CatalogTxnRequests returns, for catalog operation o, the registration
// (SET, CAS) or deregistration (GET, DELETE, DELETE_CAS: what it reads or
// removes) it amounts to, for the limits and permission checks that
// registrations and deregistrations already have. Exactly one is non-nil.
func CatalogTxnRequests(o *lodestonepb.CatalogTxnOp) (*lodestonepb.CatalogRegisterRequest, *lodestonepb.CatalogDeregisterRequest) {
	switch o.Verb {
	case lodestonepb.TxnOp_SET, lodestonepb.TxnOp_CAS:
		return catalogTxnRegister(o), nil
	}
	return nil, catalogTxnDeregister(o)
}

// checkCatalogTxn is CheckCommand for a catalog transaction: at least one
// operation; KV operations as in a KV transaction; a catalog operation
// names exactly one node, service or check, with a verb Consul has for
// them, and amounts to a well-formed registration or deregistration.
func checkCatalogTxn(t *lodestonepb.CatalogTxnRequest) error {
	if t == nil || len(t.Ops) == 0 {
		return invalid(-1, "ops", RuleTxnNonEmpty, "transaction has no operations; want at least 1")
	}
	for i, op := range t.Ops {
		switch o := op.GetOp().(type) {
		case *lodestonepb.MixedTxnOp_Kv:
			if err := checkTxnOp(i, o.Kv); err != nil {
				return err
			}
		case *lodestonepb.MixedTxnOp_Catalog:
			if err := checkCatalogTxnOp(i, o.Catalog); err != nil {
				return err
			}
		default:
			return invalid(i, "op", RuleCommandOp, "operation %d is empty; want a KV, node, service or check operation", i)
		}
	}
	return nil
}

func checkCatalogTxnOp(i int, o *lodestonepb.CatalogTxnOp) error {
	if o == nil {
		return invalid(i, "op", RuleCommandOp, "operation %d is empty; want a KV, node, service or check operation", i)
	}
	set := 0
	for _, present := range []bool{o.GetNode() != nil, o.GetService() != nil, o.GetCheck() != nil} {
		if present {
			set++
		}
	}
	if set != 1 {
		return invalid(i, "op", RuleCommandOp, "a catalog operation names exactly one node, service or check; this one names %d", set)
	}
	switch o.Verb {
	case lodestonepb.TxnOp_SET, lodestonepb.TxnOp_GET, lodestonepb.TxnOp_DELETE:
		if o.Index != 0 {
			return invalid(i, "index", RuleUnusedField, "index is not used by %s; use CAS or DELETE_CAS for a conditional write", o.Verb)
		}
	case lodestonepb.TxnOp_CAS, lodestonepb.TxnOp_DELETE_CAS:
	default:
		return invalid(i, "verb", RuleKnownVerb, "verb %s is not a catalog operation; use SET, GET, DELETE, CAS or DELETE_CAS", o.Verb)
	}
	node, id, _ := catalogTxnTarget(o)
	if err := checkName("node", node, true); err != nil {
		return AtOp(i, err)
	}
	if o.Node == nil {
		if err := checkName("id", id, true); err != nil {
			return AtOp(i, err)
		}
	}
	reg, dereg := CatalogTxnRequests(o)
	if reg != nil {
		return AtOp(i, checkRegister(reg))
	}
	return AtOp(i, checkDeregister(dereg))
}

// AtOp places err, an *InvalidError about a single request, at operation
// i of a transaction; other errors (and nil) pass unchanged.
func AtOp(i int, err error) error {
	var ie *InvalidError
	if errors.As(err, &ie) && ie.Op < 0 {
		c := *ie
		c.Op = i
		return &c
	}
	return err
}

// validateCatalogTxn is ValidateCommand for a catalog transaction: the
// operation count limit, each KV operation as in a KV transaction, each
// catalog operation as the registration or deregistration it amounts to.
func (l Limits) validateCatalogTxn(t *lodestonepb.CatalogTxnRequest) error {
	if len(t.GetOps()) > l.MaxTxnOps {
		return invalid(-1, "ops", RuleMaxTxnOps,
			"transaction has %d operations; at most %d allowed (limit max-txn-ops)", len(t.Ops), l.MaxTxnOps)
	}
	for i, op := range t.GetOps() {
		if kv := op.GetKv(); kv != nil {
			if err := l.validateTxnOp(i, kv); err != nil {
				return err
			}
			continue
		}
		c := op.GetCatalog()
		if err := checkCatalogTxnOp(i, c); c == nil || err != nil {
			continue // NB: CheckCommand refuses it, and its words are better
		}
		reg, dereg := CatalogTxnRequests(c)
		var err error
		if reg != nil {
			err = l.validateRegister(reg)
		} else {
			err = l.names(name{"node", dereg.Node}, name{"service_id", dereg.ServiceId}, name{"check_id", dereg.CheckId})
		}
		if err != nil {
			return AtOp(i, err)
		}
	}
	return nil
}
