package acl

import (
	"fmt"
	"unsafe"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// CheckCommand checks that a may propose cmd: the one set of write rules
// both doors (gRPC and the Consul HTTP API) apply. Commands only servers
// propose (members, admission, session invalidation) need operator write.
func CheckCommand(a *Authorizer, c Catalog, cmd *lodestonepb.Command) error {
	switch op := cmd.Op.(type) {
	case *lodestonepb.Command_Put:
		return CheckPut(a, op.Put)
	case *lodestonepb.Command_Delete:
		return CheckDelete(a, op.Delete)
	case *lodestonepb.Command_Txn:
		return CheckTxn(a, op.Txn)
	case *lodestonepb.Command_CatalogTxn:
		return CheckCatalogTxn(a, c, op.CatalogTxn)
	case *lodestonepb.Command_CatalogRegister:
		return CheckRegister(a, c, op.CatalogRegister)
	case *lodestonepb.Command_CatalogDeregister:
		return CheckDeregister(a, c, op.CatalogDeregister)
	case *lodestonepb.Command_CheckUpdate:
		return CheckCheckUpdate(a, c, op.CheckUpdate)
	case *lodestonepb.Command_SessionCreate:
		return a.Check(ResourceSession, op.SessionCreate.GetSession().GetNode(), AccessWrite)
	case *lodestonepb.Command_SessionDestroy:
		return a.Check(ResourceSession, c.SessionNode(op.SessionDestroy.Id), AccessWrite)
	case *lodestonepb.Command_SessionRenew:
		return a.Check(ResourceSession, c.SessionNode(op.SessionRenew.Id), AccessWrite)
	case *lodestonepb.Command_Restore:
		// NB: as Consul's snapshot restore: the state holds every token.
		return a.Check(ResourceACL, "", AccessWrite)
	}
	return a.Check(ResourceOperator, "", AccessWrite)
}

// CheckPut checks a put: write on its key. The gRPC door calls it on the
// request itself rather than wrap it in a Command per call.
func CheckPut(a *Authorizer, p *lodestonepb.PutRequest) error {
	return CheckKey(a, p.Key, AccessWrite)
}

// CheckDelete checks a delete: write on its key, or on every key under
// it for a prefix delete.
func CheckDelete(a *Authorizer, d *lodestonepb.DeleteRequest) error {
	return CheckUnder(a, ResourceKey, string(d.Key), d.Prefix, AccessWrite)
}

// CheckKey is Check on a key held as bytes. NB: Allowed keeps no
// reference to the name, so the key's bytes serve as it without a copy;
// only a refusal copies them, into its DeniedError.
func CheckKey(a *Authorizer, key []byte, want Access) error {
	if a.Allowed(ResourceKey, unsafe.String(unsafe.SliceData(key), len(key)), want) {
		return nil
	}
	return a.Check(ResourceKey, string(key), want)
}

// CheckUnder checks want on name, or, when under, on every name that
// starts with it (a prefix delete, a prefix watch).
func CheckUnder(a *Authorizer, res Resource, name string, under bool, want Access) error {
	if !under {
		return a.Check(res, name, want)
	}
	if a.AllowedUnder(res, name, want) {
		return nil
	}
	return &DeniedError{AccessorID: a.AccessorID(), Resource: res, Access: want, Name: name + "*"}
}

// CheckTxn checks every operation of a transaction: reads need read,
// writes write, a prefix delete write on every key under its prefix.
func CheckTxn(a *Authorizer, t *lodestonepb.TxnRequest) error {
	for i, op := range t.Ops {
		if err := checkTxnOp(a, op); err != nil {
			return fmt.Errorf("operation %d: %w", i, err)
		}
	}
	return nil
}

func checkTxnOp(a *Authorizer, op *lodestonepb.TxnOp) error {
	want, under := AccessWrite, false
	switch op.Verb {
	case lodestonepb.TxnOp_GET, lodestonepb.TxnOp_CHECK_INDEX, lodestonepb.TxnOp_CHECK_NOT_EXISTS, lodestonepb.TxnOp_CHECK_SESSION:
		want = AccessRead
	case lodestonepb.TxnOp_DELETE_PREFIX:
		under = true
	}
	if under {
		return CheckUnder(a, ResourceKey, string(op.Key), true, want)
	}
	return CheckKey(a, op.Key, want)
}

// CheckCatalogTxn checks a transaction of KV and catalog operations, as
// Consul's /v1/txn does: KV operations as CheckTxn; a catalog GET needs
// read on what it reads (a service's, or a check's service, else the
// node); a SET or CAS what the registration it amounts to needs, a delete
// what the deregistration needs.
func CheckCatalogTxn(a *Authorizer, c Catalog, t *lodestonepb.CatalogTxnRequest) error {
	for i, op := range t.GetOps() {
		var err error
		if kv := op.GetKv(); kv != nil {
			err = checkTxnOp(a, kv)
		} else if o := op.GetCatalog(); o != nil {
			err = checkCatalogOp(a, c, o)
		}
		if err != nil {
			return fmt.Errorf("operation %d: %w", i, err)
		}
	}
	return nil
}

func checkCatalogOp(a *Authorizer, c Catalog, o *lodestonepb.CatalogTxnOp) error {
	verb := o.Verb
	write := verb == lodestonepb.TxnOp_SET || verb == lodestonepb.TxnOp_CAS
	read := verb == lodestonepb.TxnOp_GET
	switch {
	case o.Node != nil:
		switch {
		case read:
			return a.Check(ResourceNode, o.Node.Name, AccessRead)
		case write:
			return CheckRegister(a, c, &lodestonepb.CatalogRegisterRequest{Node: o.Node})
		}
		return CheckDeregister(a, c, &lodestonepb.CatalogDeregisterRequest{Node: o.Node.Name})
	case o.Service != nil:
		s := o.Service
		id := s.Id
		if id == "" {
			id = s.Name
		}
		switch {
		case read:
			name := c.ServiceName(s.Node, id)
			if name == "" {
				name = s.Name
			}
			return a.Check(ResourceService, name, AccessRead)
		case write:
			return CheckRegister(a, c, &lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: s.Node},
				SkipNodeUpdate: true, Service: s})
		}
		return CheckDeregister(a, c, &lodestonepb.CatalogDeregisterRequest{Node: s.Node, ServiceId: id})
	case o.Check != nil:
		ch := o.Check
		id := ch.CheckId
		if id == "" {
			id = ch.Name
		}
		switch {
		case read:
			if svc := c.CheckService(ch.Node, id); svc != "" {
				return a.Check(ResourceService, svc, AccessRead)
			}
			return a.Check(ResourceNode, ch.Node, AccessRead)
		case write:
			return CheckRegister(a, c, &lodestonepb.CatalogRegisterRequest{Node: &lodestonepb.Node{Name: ch.Node},
				SkipNodeUpdate: true, Checks: []*lodestonepb.Check{ch}})
		}
		return CheckDeregister(a, c, &lodestonepb.CatalogDeregisterRequest{Node: ch.Node, CheckId: id})
	}
	return nil
}

// CheckRegister follows Consul: write on the node unless its record is
// left alone, on the service, and for each check on what it watches (its
// service, or its node).
func CheckRegister(a *Authorizer, cat Catalog, r *lodestonepb.CatalogRegisterRequest) error {
	node := r.GetNode().GetName()
	if !r.SkipNodeUpdate {
		if err := a.Check(ResourceNode, node, AccessWrite); err != nil {
			return err
		}
	}
	if r.Service != nil {
		if err := a.Check(ResourceService, r.Service.Name, AccessWrite); err != nil {
			return err
		}
	}
	for _, c := range r.Checks {
		name := c.ServiceName
		switch {
		case c.ServiceId == "":
		case r.Service != nil && c.ServiceId == r.Service.Id:
			name = r.Service.Name
		case name == "":
			name = cat.ServiceName(node, c.ServiceId)
		}
		var err error
		if c.ServiceId != "" && name != "" {
			err = a.Check(ResourceService, name, AccessWrite)
		} else {
			err = a.Check(ResourceNode, node, AccessWrite)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// CheckDeregister: removing a service needs write on that service, a
// service's check write on its service, anything else write on the node.
func CheckDeregister(a *Authorizer, c Catalog, r *lodestonepb.CatalogDeregisterRequest) error {
	switch {
	case r.CheckId != "":
		if svc := c.CheckService(r.Node, r.CheckId); svc != "" {
			return a.Check(ResourceService, svc, AccessWrite)
		}
	case r.ServiceId != "":
		if svc := c.ServiceName(r.Node, r.ServiceId); svc != "" {
			return a.Check(ResourceService, svc, AccessWrite)
		}
	}
	return a.Check(ResourceNode, r.Node, AccessWrite)
}

// CheckCheckUpdate: a service's check is its service's to report (a TTL
// check updated by the service itself), a node's check its node's.
func CheckCheckUpdate(a *Authorizer, c Catalog, r *lodestonepb.UpdateCheckRequest) error {
	if svc := c.CheckService(r.Node, r.CheckId); svc != "" {
		return a.Check(ResourceService, svc, AccessWrite)
	}
	return a.Check(ResourceNode, r.Node, AccessWrite)
}

// CheckWatch checks a watch a stream creates: a KV watch needs read on
// every key it may deliver, a catalog watch read on its service (on every
// service when it names none).
func CheckWatch(a *Authorizer, c *lodestonepb.WatchCreate) error {
	if c.Target == lodestonepb.WatchTarget_WATCH_TARGET_CATALOG_SERVICES {
		return CheckUnder(a, ResourceService, string(c.Key), len(c.Key) == 0, AccessRead)
	}
	return CheckUnder(a, ResourceKey, string(c.Key), c.Prefix, AccessRead)
}
