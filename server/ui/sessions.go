package ui

import (
	"context"
	"net/http"
	"time"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/store"
)

type sessionRow struct {
	S         *lodestonepb.SessionEntry
	TTL       time.Duration
	LockDelay time.Duration
	Locks     []string
}

type sessionsData struct {
	Sessions []sessionRow
	Locks    int
	Index    uint64
}

// sessionsDep wakes on sessions and on KV writes (a lock taken or released
// is a KV write).
func sessionsDep() consulapi.Dep {
	return consulapi.Dep{Key: "", Prefix: true, Index: func(s *store.Store) uint64 { return sessionsIndex(s) }}
}

func sessionsIndex(st Reader) uint64 { return max(st.SessionsIndex(), st.KVIndex()) }

func (u *UI) sessionsPage(ctx context.Context, r *http.Request, rc *request) (*built, error) {
	st := u.b.Store()
	d := &sessionsData{Index: sessionsIndex(st)}
	all, _ := st.Sessions()
	for _, s := range acl.FilterSessions(rc.az, all) {
		row := sessionRow{S: s, TTL: s.GetTtl().AsDuration(), LockDelay: s.GetLockDelay().AsDuration()}
		for _, k := range st.SessionLocks(s.Id) {
			if rc.az.Allowed(acl.ResourceKey, k, acl.AccessRead) {
				row.Locks = append(row.Locks, k)
			}
		}
		d.Locks += len(row.Locks)
		d.Sessions = append(d.Sessions, row)
	}
	return &built{title: "Sessions and locks", data: d, wait: u.waitOn(sessionsDep(), d.Index)}, nil
}
