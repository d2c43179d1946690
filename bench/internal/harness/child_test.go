package harness

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestChildRoundTrip drives a real child process over its pipes: cat
// answers each line with itself.
func TestChildRoundTrip(t *testing.T) {
	c, err := StartChild("cat", "cat", nil, filepath.Join(t.TempDir(), "cat.log"), "")
	if err != nil {
		t.Fatal(err)
	}
	type msg struct {
		N    int      `json:"n"`
		Keys []string `json:"keys"`
	}
	for i := range 3 {
		want := msg{N: i, Keys: []string{"a", strings.Repeat("b", i)}}
		if err := c.Send(want); err != nil {
			t.Fatal(err)
		}
		var got msg
		if err := c.Recv(context.Background(), &got); err != nil {
			t.Fatal(err)
		}
		if got.N != want.N || len(got.Keys) != 2 || got.Keys[1] != want.Keys[1] {
			t.Errorf("round trip %d: got %+v, want %+v", i, got, want)
		}
	}
	if err := c.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	if exited, _ := c.Proc().Exited(); !exited {
		t.Error("cat still running after Stop")
	}
	if err := c.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
}

// TestChildRecvEndsWithContext: a child that never answers is stopped
// when the context ends, at once (signalled), not after the grace a
// child gets to finish once its stdin ends.
func TestChildRecvEndsWithContext(t *testing.T) {
	c, err := StartChild("sleep", "sleep", []string{"60"}, filepath.Join(t.TempDir(), "sleep.log"), "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	var v struct{}
	start := time.Now()
	err = c.Recv(ctx, &v)
	if err == nil || ctx.Err() == nil {
		t.Fatalf("Recv = %v, want the context's error", err)
	}
	if took := time.Since(start); took >= childGrace {
		t.Errorf("Recv took %v to give up, want the child signalled before its grace (%v) ran out", took, childGrace)
	}
	if exited, _ := c.Proc().Exited(); !exited {
		t.Error("child still running after Recv gave up")
	}
}

// TestParentLink is the child's side: what it reads and what it writes.
func TestParentLink(t *testing.T) {
	var out bytes.Buffer
	p := Parent(strings.NewReader(`{"n":7}`+"\n"), &out)
	var got struct{ N int }
	if err := p.Recv(&got); err != nil || got.N != 7 {
		t.Fatalf("Recv = %+v, %v", got, err)
	}
	if err := p.Recv(&got); err == nil {
		t.Error("Recv past the end succeeded")
	}
	if err := p.Send(struct {
		Ok bool `json:"ok"`
	}{true}); err != nil || out.String() != `{"ok":true}`+"\n" {
		t.Errorf("Send wrote %q, %v", out.String(), err)
	}
}
