package consulapi

import (
	"fmt"
	"net/http"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// /v1/txn with Node, Service and Check operations beside KV ones (Consul's
// api.NodeTxnOp, ServiceTxnOp, CheckTxnOp). They go to the store as one
// catalog transaction: one Raft entry, all operations or none.

// txnNodeOp is api.NodeTxnOp.
type txnNodeOp struct {
	Verb string
	Node struct {
		ID              string
		Node            string
		Address         string
		Datacenter      string
		TaggedAddresses map[string]string
		Meta            map[string]string
		ModifyIndex     uint64
	}
}

// txnServiceOp is api.ServiceTxnOp.
type txnServiceOp struct {
	Verb    string
	Node    string
	Service struct {
		serviceIn
		ModifyIndex uint64
	}
}

// txnCheckOp is api.CheckTxnOp.
type txnCheckOp struct {
	Verb  string
	Check healthCheckJSON
}

// catalogVerbs are the verbs Consul has for node, service and check
// operations.
var catalogVerbs = map[string]lodestonepb.TxnOp_Verb{
	"set":        lodestonepb.TxnOp_SET,
	"get":        lodestonepb.TxnOp_GET,
	"cas":        lodestonepb.TxnOp_CAS,
	"delete":     lodestonepb.TxnOp_DELETE,
	"delete-cas": lodestonepb.TxnOp_DELETE_CAS,
}

// catalogTxnVerb maps a node, service or check verb; index is what CAS and
// DELETE_CAS compare with (the object's ModifyIndex, as Consul takes it).
func catalogTxnVerb(kind, verb string, modifyIndex uint64) (lodestonepb.TxnOp_Verb, uint64, error) {
	v, ok := catalogVerbs[verb]
	if !ok {
		return 0, 0, fmt.Errorf("unknown %s verb %q: use set, get, cas, delete or delete-cas", kind, verb)
	}
	if v == lodestonepb.TxnOp_CAS || v == lodestonepb.TxnOp_DELETE_CAS {
		return v, modifyIndex, nil
	}
	return v, 0, nil
}

// pb is the store's form of op.
func (op txnOp) pb() (*lodestonepb.MixedTxnOp, error) {
	switch {
	case op.KV != nil:
		o, err := op.KV.pb()
		if err != nil {
			return nil, err
		}
		return &lodestonepb.MixedTxnOp{Op: &lodestonepb.MixedTxnOp_Kv{Kv: o}}, nil
	case op.Node != nil:
		n := op.Node.Node
		verb, index, err := catalogTxnVerb("Node", op.Node.Verb, n.ModifyIndex)
		if err != nil {
			return nil, err
		}
		return catalogMixed(&lodestonepb.CatalogTxnOp{Verb: verb, Index: index, Node: &lodestonepb.Node{Id: n.ID, Name: n.Node,
			Address: n.Address, Datacenter: n.Datacenter, TaggedAddresses: n.TaggedAddresses, Meta: n.Meta}}), nil
	case op.Service != nil:
		s := op.Service.Service
		verb, index, err := catalogTxnVerb("Service", op.Service.Verb, s.ModifyIndex)
		if err != nil {
			return nil, err
		}
		var svc *lodestonepb.Service
		if verb == lodestonepb.TxnOp_SET || verb == lodestonepb.TxnOp_CAS {
			if svc, err = s.serviceIn.pb(); err != nil {
				return nil, err
			}
		} else {
			// NB: a get or delete names the service by id only.
			svc = &lodestonepb.Service{Id: s.ID, Name: s.Service}
		}
		svc.Node = op.Service.Node
		return catalogMixed(&lodestonepb.CatalogTxnOp{Verb: verb, Index: index, Service: svc}), nil
	case op.Check != nil:
		verb, index, err := catalogTxnVerb("Check", op.Check.Verb, op.Check.Check.ModifyIndex)
		if err != nil {
			return nil, err
		}
		c, err := op.Check.Check.pb()
		if err != nil {
			return nil, err
		}
		c.CreateIndex, c.ModifyIndex = 0, 0
		return catalogMixed(&lodestonepb.CatalogTxnOp{Verb: verb, Index: index, Check: c}), nil
	}
	return nil, fmt.Errorf("operation has no KV, Node, Service or Check part")
}

func catalogMixed(o *lodestonepb.CatalogTxnOp) *lodestonepb.MixedTxnOp {
	return &lodestonepb.MixedTxnOp{Op: &lodestonepb.MixedTxnOp_Catalog{Catalog: o}}
}

// txnCatalogResult is api.TxnResult.
type txnCatalogResult struct {
	KV      *kvEntry          `json:",omitempty"`
	Node    *nodeJSON         `json:",omitempty"`
	Service *agentServiceJSON `json:",omitempty"`
	Check   *healthCheckJSON  `json:",omitempty"`
}

// catalogTxn answers a /v1/txn that has catalog operations, as Consul
// does: 200 with the results of the operations that return something, or
// 409 with the errors of those that failed.
func (a *API) catalogTxn(w http.ResponseWriter, r *http.Request, ops []txnOp) error {
	pbOps, errs := convertTxnOps(ops, txnOp.pb)
	if len(errs) > 0 {
		writeTxnErrors(w, errs)
		return nil
	}
	req := &lodestonepb.CatalogTxnRequest{Ops: pbOps}
	res, index, err := a.apply(r, &lodestonepb.Command{Op: &lodestonepb.Command_CatalogTxn{CatalogTxn: req}})
	if err != nil {
		return err
	}
	a.setMeta(w, index)
	out := res.GetCatalogTxn()
	if !out.GetSucceeded() {
		writeTxnErrors(w, txnErrorsOf(out.GetErrors()))
		return nil
	}
	results := []txnCatalogResult{}
	for _, tr := range out.Results {
		var one txnCatalogResult
		switch {
		case tr.GetKv().GetKv() != nil:
			e := toEntry(tr.Kv.Kv)
			one.KV = &e
		case tr.GetNode() != nil:
			one.Node = nodeOut(tr.Node)
		case tr.GetService() != nil:
			one.Service = serviceOut(tr.Service)
		case tr.GetCheck() != nil:
			c := checkOut(tr.Check)
			one.Check = &c
		default:
			continue // NB: as Consul, a delete returns nothing
		}
		results = append(results, one)
	}
	writeJSON(w, http.StatusOK, map[string]any{"Results": results, "Errors": nil})
	return nil
}
