package acl

import (
	"errors"
	"testing"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// catalog is a fixed Catalog: session s1 lives on node n1, which runs
// service web (id web1) with check c-web, and has the node check c-node.
type catalog struct{}

func (catalog) SessionNode(id string) string {
	if id == "s1" {
		return "n1"
	}
	return ""
}

func (catalog) ServiceName(node, id string) string {
	if node == "n1" && id == "web1" {
		return "web"
	}
	return ""
}

func (catalog) CheckService(node, id string) string {
	if node == "n1" && id == "c-web" {
		return "web"
	}
	return ""
}

func authorizerOf(t *testing.T, rules string) *Authorizer {
	t.Helper()
	rs, err := ParseRules(rules)
	if err != nil {
		t.Fatal(err)
	}
	return Compile("tok", [][]Rule{rs}, AccessDeny)
}

func TestCheckCommand(t *testing.T) {
	web := authorizerOf(t, `service "web" { policy = "write" }
key_prefix "app/" { policy = "write" }
key "app/secret" { policy = "deny" }`)
	put := func(k string) *lodestonepb.Command {
		return &lodestonepb.Command{Op: &lodestonepb.Command_Put{Put: &lodestonepb.PutRequest{Key: []byte(k)}}}
	}
	txn := func(ops ...*lodestonepb.TxnOp) *lodestonepb.Command {
		return &lodestonepb.Command{Op: &lodestonepb.Command_Txn{Txn: &lodestonepb.TxnRequest{Ops: ops}}}
	}
	for _, c := range []struct {
		name string
		cmd  *lodestonepb.Command
		want string // "" allowed, else the denied permission
	}{
		{"put under the prefix", put("app/x"), ""},
		{"put outside", put("other/x"), "key:write"},
		{"put on the denied key", put("app/secret"), "key:write"},
		{"prefix delete over a denied key", &lodestonepb.Command{Op: &lodestonepb.Command_Delete{Delete: &lodestonepb.DeleteRequest{Key: []byte("app/"), Prefix: true}}}, "key:write"},
		{"txn reads and writes its own", txn(&lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_GET, Key: []byte("app/a")}, &lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: []byte("app/b")}), ""},
		{"txn with one foreign write", txn(&lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: []byte("app/b")}, &lodestonepb.TxnOp{Verb: lodestonepb.TxnOp_SET, Key: []byte("x")}), "key:write"},
		{"agent-style register of web", &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
			Node: &lodestonepb.Node{Name: "n1"}, SkipNodeUpdate: true, Service: &lodestonepb.Service{Id: "web1", Name: "web"},
			Checks: []*lodestonepb.Check{{CheckId: "c-web", ServiceId: "web1"}}}}}, ""},
		{"a check on web by service id only", &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
			Node: &lodestonepb.Node{Name: "n1"}, SkipNodeUpdate: true, Checks: []*lodestonepb.Check{{CheckId: "c2", ServiceId: "web1"}}}}}, ""},
		{"register with the node record", &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
			Node: &lodestonepb.Node{Name: "n1"}, Service: &lodestonepb.Service{Id: "web1", Name: "web"}}}}, "node:write"},
		{"register another service", &lodestonepb.Command{Op: &lodestonepb.Command_CatalogRegister{CatalogRegister: &lodestonepb.CatalogRegisterRequest{
			Node: &lodestonepb.Node{Name: "n1"}, SkipNodeUpdate: true, Service: &lodestonepb.Service{Id: "db1", Name: "db"}}}}, "service:write"},
		{"deregister web by id", &lodestonepb.Command{Op: &lodestonepb.Command_CatalogDeregister{CatalogDeregister: &lodestonepb.CatalogDeregisterRequest{Node: "n1", ServiceId: "web1"}}}, ""},
		{"deregister the node", &lodestonepb.Command{Op: &lodestonepb.Command_CatalogDeregister{CatalogDeregister: &lodestonepb.CatalogDeregisterRequest{Node: "n1"}}}, "node:write"},
		{"update web's check", &lodestonepb.Command{Op: &lodestonepb.Command_CheckUpdate{CheckUpdate: &lodestonepb.UpdateCheckRequest{Node: "n1", CheckId: "c-web"}}}, ""},
		{"update the node check", &lodestonepb.Command{Op: &lodestonepb.Command_CheckUpdate{CheckUpdate: &lodestonepb.UpdateCheckRequest{Node: "n1", CheckId: "c-node"}}}, "node:write"},
		{"destroy a session on n1", &lodestonepb.Command{Op: &lodestonepb.Command_SessionDestroy{SessionDestroy: &lodestonepb.DestroySessionRequest{Id: "s1"}}}, "session:write"},
		{"a server-only command", &lodestonepb.Command{Op: &lodestonepb.Command_Admission{Admission: &lodestonepb.AdmissionPolicy{}}}, "operator:write"},
	} {
		err := CheckCommand(web, catalog{}, c.cmd)
		var de *DeniedError
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%s: denied: %v", c.name, err)
		case c.want != "" && !errors.As(err, &de):
			t.Errorf("%s: got %v, want a denial of %s", c.name, err, c.want)
		case c.want != "" && string(de.Resource)+":"+de.Access.String() != c.want:
			t.Errorf("%s: denied %s:%s, want %s", c.name, de.Resource, de.Access, c.want)
		}
	}
	if err := CheckCommand(AllowAll("mgmt"), catalog{}, put("anything")); err != nil {
		t.Errorf("management denied: %v", err)
	}
}

func TestFiltersNeverEditTheirInput(t *testing.T) {
	a := authorizerOf(t, `key_prefix "a/" { policy = "read" }`)
	in := []*lodestonepb.KeyValue{{Key: []byte("a/1")}, {Key: []byte("b/1")}, {Key: []byte("a/2")}}
	out := FilterKVs(a, in)
	if len(out) != 2 || string(out[0].Key) != "a/1" || string(out[1].Key) != "a/2" {
		t.Fatalf("FilterKVs = %v", out)
	}
	if string(in[1].Key) != "b/1" || len(in) != 3 {
		t.Fatalf("input edited: %v", in)
	}
	all := in[:1]
	if got := FilterKVs(a, all); &got[0] != &all[0] {
		t.Error("a list with nothing to drop was copied")
	}
}
