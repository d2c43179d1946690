package server

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"

	"github.com/lodestone-kv/lodestone/tools/snapshot"
)

func saveSnapshot(t *testing.T, cl *consul.Client) ([]byte, uint64) {
	t.Helper()
	rc, meta, err := cl.Snapshot().Save(nil)
	if err != nil {
		t.Fatalf("save: %v", err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return b, meta.LastIndex
}

// The official client's Snapshot().Save and Restore round-trip a 3-member
// cluster's state: what changed after the save is undone on every member,
// and the file is the one `lodestone snapshot inspect` reads.
func TestConsulSnapshotSaveRestore(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	cl := consulClient(t, c, c.followersOf(lead)[0])
	for k, v := range map[string]string{"app/a": "1", "app/b": "2"} {
		if _, err := cl.KV().Put(&consul.KVPair{Key: k, Value: []byte(v)}, nil); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := cl.Catalog().Register(&consul.CatalogRegistration{Node: "edge-1", Address: "10.0.0.1",
		Service: &consul.AgentService{ID: "web-1", Service: "web", Port: 80}}, nil); err != nil {
		t.Fatal(err)
	}
	snap, index := saveSnapshot(t, cl)
	if index == 0 {
		t.Fatal("save answered no X-Consul-Index")
	}
	path := filepath.Join(t.TempDir(), "saved.snap")
	if err := os.WriteFile(path, snap, 0o600); err != nil {
		t.Fatal(err)
	}
	info, err := snapshot.Inspect(path)
	if err != nil || info.Keys != 2 || info.Services != 1 || info.Index != index {
		t.Fatalf("inspect the saved file: %+v %v, want 2 keys and 1 service at index %d", info, err, index)
	}

	if _, err := cl.KV().Put(&consul.KVPair{Key: "app/a", Value: []byte("changed")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.KV().Put(&consul.KVPair{Key: "app/new", Value: []byte("x")}, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.KV().Delete("app/b", nil); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Catalog().Deregister(&consul.CatalogDeregistration{Node: "edge-1"}, nil); err != nil {
		t.Fatal(err)
	}
	if err := cl.Snapshot().Restore(nil, bytes.NewReader(snap)); err != nil {
		t.Fatalf("restore: %v", err)
	}
	for _, name := range c.names {
		m := consulClient(t, c, name)
		var got map[string]string
		waitFor(t, 10*time.Second, func() bool {
			pairs, _, err := m.KV().List("app/", &consul.QueryOptions{AllowStale: true})
			if err != nil {
				return false
			}
			got = map[string]string{}
			for _, p := range pairs {
				got[p.Key] = string(p.Value)
			}
			return len(got) == 2 && got["app/a"] == "1" && got["app/b"] == "2"
		})
		insts, _, err := m.Catalog().Service("web", "", &consul.QueryOptions{AllowStale: true})
		if err != nil || len(insts) != 1 || insts[0].Node != "edge-1" {
			t.Fatalf("%s: web after restore: %+v %v", name, insts, err)
		}
	}
	// The cluster goes on writing after the restore.
	if _, err := cl.KV().Put(&consul.KVPair{Key: "app/after", Value: []byte("y")}, nil); err != nil {
		t.Fatalf("write after restore: %v", err)
	}
}

// A restore is refused, and changes nothing, for bytes that are not a
// snapshot file and for a snapshot of another cluster.
func TestConsulSnapshotRestoreRefusals(t *testing.T) {
	c := newTestCluster(t, 1)
	lead := c.waitLeader()
	cl := consulClient(t, c, lead)
	if _, err := cl.KV().Put(&consul.KVPair{Key: "k", Value: []byte("ours")}, nil); err != nil {
		t.Fatal(err)
	}
	good, _ := saveSnapshot(t, cl)
	damaged := append([]byte(nil), good...)
	damaged[len(damaged)-40] ^= 0xff

	other := newTestCluster(t, 1)
	ocl := consulClient(t, other, other.waitLeader())
	for range 20 {
		if _, err := ocl.KV().Put(&consul.KVPair{Key: "k", Value: []byte("theirs")}, nil); err != nil {
			t.Fatal(err)
		}
	}
	foreign, _ := saveSnapshot(t, ocl)

	for _, tc := range []struct {
		name string
		body []byte
		want string
	}{
		{"damaged", damaged, "failed to read snapshot: checksum mismatch"},
		{"not a snapshot", []byte("hello"), "failed to read snapshot: truncated"},
		{"another cluster", foreign, "restores online only into the cluster it was saved from"},
	} {
		err := cl.Snapshot().Restore(nil, bytes.NewReader(tc.body))
		if err == nil || !strings.Contains(err.Error(), "500") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("restore %s: %v, want a 500 saying %q", tc.name, err, tc.want)
		}
	}
	if kv, _, err := cl.KV().Get("k", nil); err != nil || kv == nil || string(kv.Value) != "ours" {
		t.Fatalf("k after refused restores: %+v %v", kv, err)
	}
}

// Saving and restoring need acl:write, as Consul's need a management
// token: a token with operator:write and every key is refused both.
func TestConsulSnapshotNeedsACLWrite(t *testing.T) {
	c := newTestCluster(t, 1, withACLs)
	lead := c.waitLeader()
	boot, _, err := consulAs(t, c, lead, "").ACL().Bootstrap()
	if err != nil {
		t.Fatal(err)
	}
	mgmt := consulAs(t, c, lead, boot.SecretID)
	if _, err := mgmt.KV().Put(&consul.KVPair{Key: "k", Value: []byte("v1")}, nil); err != nil {
		t.Fatal(err)
	}
	snap, _ := saveSnapshot(t, mgmt)
	if _, err := mgmt.KV().Put(&consul.KVPair{Key: "k", Value: []byte("v2")}, nil); err != nil {
		t.Fatal(err)
	}
	op := consulAs(t, c, lead, tokenWith(t, mgmt, "op", `operator = "write"
key_prefix "" { policy = "write" }
acl = "read"`))
	_, _, err = op.Snapshot().Save(nil)
	wantDenied(t, "save without acl:write", err)
	wantDenied(t, "restore without acl:write", op.Snapshot().Restore(nil, bytes.NewReader(snap)))
	if kv, _, _ := mgmt.KV().Get("k", nil); kv == nil || string(kv.Value) != "v2" {
		t.Fatalf("k after a refused restore: %+v", kv)
	}
	if err := mgmt.Snapshot().Restore(nil, bytes.NewReader(snap)); err != nil {
		t.Fatalf("restore with the management token: %v", err)
	}
	if kv, _, _ := mgmt.KV().Get("k", nil); kv == nil || string(kv.Value) != "v1" {
		t.Fatalf("k after the restore: %+v", kv)
	}
}
