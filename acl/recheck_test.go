package acl

import (
	"context"
	"errors"
	"testing"
)

func TestRecheckCatchesUpOnlyOnARefusal(t *testing.T) {
	known := false
	caughtUp := 0
	catchUp := func(context.Context) error { caughtUp++; known = true; return nil }
	check := func() error {
		if !known {
			return ErrNotFound
		}
		return nil
	}
	if err := Recheck(context.Background(), catchUp, check); err != nil || caughtUp != 1 {
		t.Fatalf("a token applied on catching up: err %v, catch-ups %d", err, caughtUp)
	}
	if err := Recheck(context.Background(), catchUp, check); err != nil || caughtUp != 1 {
		t.Fatalf("an allowed check caught up: err %v, catch-ups %d", err, caughtUp)
	}
	denied := DenyAll("x").Check(ResourceKey, "k", AccessWrite)
	if err := Recheck(context.Background(), catchUp, func() error { return denied }); err != denied || caughtUp != 2 {
		t.Fatalf("a real denial: err %v, catch-ups %d", err, caughtUp)
	}
	failing := func(context.Context) error { return errors.New("no leader") }
	if err := Recheck(context.Background(), failing, func() error { return denied }); err != denied {
		t.Fatalf("catch-up failed: got %v, want the first denial", err)
	}
	other := errors.New("bad request")
	if err := Recheck(context.Background(), catchUp, func() error { return other }); err != other || caughtUp != 2 {
		t.Fatalf("a non-ACL error caught up: err %v, catch-ups %d", err, caughtUp)
	}
}
