package ui

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/webui"
	"github.com/lodestone-kv/lodestone/server/consulapi"
	"github.com/lodestone-kv/lodestone/store"
)

// KV browsing bounds: a prefix with more keys than maxScan is listed in
// part, and a listing shows at most maxRows entries (folded folders
// count one each); the page says so and asks for a narrower prefix.
const (
	maxScan   = 50000
	maxRows   = 1000
	rangeStep = 2000
)

type kvRow struct {
	Key      string // the whole key, or a folder's prefix ending in "/"
	Name     string // what is shown: the part after the listed prefix
	Folder   bool
	Keys     int // a folder's keys
	Modify   uint64
	Flags    uint64
	Session  string
	SessionS string
}

type crumb struct{ Name, Prefix string }

type kvListData struct {
	Prefix string
	Crumbs []crumb
	Rows   []kvRow
	Total  int
	Cut    bool // more than maxRows entries, or more than maxScan keys
	Index  uint64
	NewKey string
}

func crumbs(prefix string) []crumb {
	out := []crumb{{Name: "(root)", Prefix: ""}}
	acc := ""
	for _, part := range strings.SplitAfter(prefix, "/") {
		if part == "" {
			continue
		}
		acc += part
		out = append(out, crumb{Name: part, Prefix: acc})
	}
	return out
}

func (u *UI) kvList(ctx context.Context, r *http.Request, rc *request) (*built, error) {
	q := r.URL.Query()
	prefix := q.Get("prefix")
	st := u.b.Store()
	d := &kvListData{Prefix: prefix, Crumbs: crumbs(prefix), Index: st.KVIndexFor([]byte(prefix), true), NewKey: prefix}
	folders := map[string]int{}
	var after []byte
	scanned := 0
	for scanned < maxScan {
		kvs, more, _ := st.Range([]byte(prefix), after, rangeStep, true)
		scanned += len(kvs)
		for _, kv := range acl.FilterKVs(rc.az, kvs) {
			rest := string(kv.Key[len(prefix):])
			if i := strings.IndexByte(rest, '/'); i >= 0 {
				dir := prefix + rest[:i+1]
				if folders[dir] == 0 {
					d.Rows = append(d.Rows, kvRow{Key: dir, Name: rest[:i+1], Folder: true})
				}
				folders[dir]++
				continue
			}
			d.Rows = append(d.Rows, kvRow{Key: string(kv.Key), Name: rest, Modify: kv.ModifyIndex, Flags: kv.Flags,
				Session: kv.Session, SessionS: webui.Truncate(8, kv.Session)})
		}
		if !more || len(kvs) == 0 {
			break
		}
		after = kvs[len(kvs)-1].Key
		if scanned >= maxScan {
			d.Cut = true
		}
	}
	for i := range d.Rows {
		if d.Rows[i].Folder {
			d.Rows[i].Keys = folders[d.Rows[i].Key]
		}
	}
	d.Total = len(d.Rows)
	if len(d.Rows) > maxRows {
		d.Rows, d.Cut = d.Rows[:maxRows], true
	}
	b := &built{title: "Key/value", data: d, wait: u.waitOn(consulapi.KVDep(prefix, true), d.Index)}
	if k := q.Get("deleted"); k != "" {
		b.flash = append(b.flash, webui.Flash{Class: "ok", Text: fmt.Sprintf("Deleted %q.", k)})
	}
	return b, nil
}

type kvEditData struct {
	Key       string
	New       bool // no such key: the form creates it
	Exists    bool
	Value     string
	Binary    bool
	Flags     uint64
	Create    uint64
	Modify    uint64
	Lock      uint64
	Session   *lodestonepb.SessionEntry
	SessionID string
	Loaded    uint64 // the ModifyIndex the form was loaded at
	Changed   bool   // the key changed since
	Parent    string
	Index     uint64
}

func parent(key string) string {
	if i := strings.LastIndexByte(strings.TrimSuffix(key, "/"), '/'); i >= 0 {
		return key[:i+1]
	}
	return ""
}

func (u *UI) kvEdit(ctx context.Context, r *http.Request, rc *request) (*built, error) {
	q := r.URL.Query()
	key := q.Get("key")
	if key == "" {
		return nil, badRequest("name a key: /ui/kv/edit?key=app/config")
	}
	if err := rc.az.Check(acl.ResourceKey, key, acl.AccessRead); err != nil {
		return nil, err
	}
	d := u.kvEditData(key)
	if s := q.Get("loaded"); s != "" {
		if n, err := strconv.ParseUint(s, 10, 64); err == nil {
			d.Loaded = n
			d.Changed = n != d.Modify
		}
	}
	b := &built{title: "Key " + key, data: d, wait: u.waitOn(consulapi.KVDep(key, false), d.Index),
		streamQuery: url.Values{"key": {key}, "loaded": {strconv.FormatUint(d.Loaded, 10)}}.Encode()}
	if s := q.Get("saved"); s != "" {
		b.flash = append(b.flash, webui.Flash{Class: "ok", Text: fmt.Sprintf("Saved at index %s.", s)})
	}
	return b, nil
}

func (u *UI) kvEditData(key string) *kvEditData {
	st := u.b.Store()
	d := &kvEditData{Key: key, Parent: parent(key), Index: st.KVIndexFor([]byte(key), false)}
	kv, _ := st.Get([]byte(key))
	if kv == nil {
		d.New = true
		return d
	}
	d.Exists = true
	d.Flags, d.Create, d.Modify, d.Lock, d.Loaded = kv.Flags, kv.CreateIndex, kv.ModifyIndex, kv.LockIndex, kv.ModifyIndex
	d.Binary = !utf8.Valid(kv.Value)
	if !d.Binary {
		d.Value = string(kv.Value)
	}
	if kv.Session != "" {
		d.SessionID = kv.Session
		d.Session, _ = st.Session(kv.Session)
	}
	return d
}

// kvForm is a KV form as posted.
type kvForm struct {
	key   string
	value []byte
	flags uint64
	cas   uint64
}

func parseKVForm(r *http.Request, withValue bool) (kvForm, error) {
	f := kvForm{key: r.PostFormValue("key")}
	if f.key == "" {
		return f, badRequest("the key is empty: give the key's full name, such as app/config")
	}
	if withValue {
		// NB: browsers send a textarea's line breaks as CRLF.
		f.value = []byte(strings.ReplaceAll(r.PostFormValue("value"), "\r\n", "\n"))
		if s := strings.TrimSpace(r.PostFormValue("flags")); s != "" {
			n, err := strconv.ParseUint(s, 10, 64)
			if err != nil {
				return f, badRequest("flags %q: a whole number from 0 to 18446744073709551615", s)
			}
			f.flags = n
		}
	}
	s := r.PostFormValue("cas")
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return f, badRequest("the form's index %q is not a number: reload the page", s)
	}
	f.cas = n
	return f, nil
}

// kvPut creates or edits a key with CAS: the form carries the ModifyIndex
// it was loaded at (0 for a new key), so a write that lost a race with
// another is refused and says so instead of overwriting it.
func (u *UI) kvPut(w http.ResponseWriter, r *http.Request) {
	az, who, ok := u.authorize(w, r)
	if !ok {
		return
	}
	if err := u.sessions.CheckCSRF(r); err != nil {
		u.errorPage(w, r, who, &pageError{http.StatusForbidden, err.Error()})
		return
	}
	f, err := parseKVForm(r, true)
	if err != nil {
		u.errorPage(w, r, who, err)
		return
	}
	cas := f.cas
	res, index, err := u.b.Write(r.Context(), az, &lodestonepb.Command{Op: &lodestonepb.Command_Put{
		Put: &lodestonepb.PutRequest{Key: []byte(f.key), Value: f.value, Flags: f.flags, Cas: &cas}}})
	if err == nil && !res.CasFailed {
		http.Redirect(w, r, Base+"kv/edit?"+url.Values{"key": {f.key}, "saved": {strconv.FormatUint(index, 10)}}.Encode(), http.StatusSeeOther)
		return
	}
	d := u.kvEditData(f.key)
	d.Value, d.Flags, d.Loaded, d.Binary = string(f.value), f.flags, f.cas, false
	code, msg := writeError(err)
	if err == nil {
		code = http.StatusConflict
		if d.Exists {
			msg = fmt.Sprintf("Not saved: %q changed since you loaded it (you edited the version of index %d; it is now at index %d). "+
				"Your text is kept below; open the key again to see the current value, then apply your change to it.", f.key, f.cas, d.Modify)
		} else {
			msg = fmt.Sprintf("Not saved: %q was deleted since you loaded it at index %d. Your text is kept below; "+
				"save again to create it anew.", f.key, f.cas)
			d.Loaded = 0
		}
	}
	d.Changed = true
	b := &built{title: "Key " + f.key, data: d, flash: []webui.Flash{{Class: "bad", Text: msg}}}
	u.render(w, "templates/kvedit.html", "layout", code, u.layout(w, r, who, "KV", b))
}

func (u *UI) kvDelete(w http.ResponseWriter, r *http.Request) {
	az, who, ok := u.authorize(w, r)
	if !ok {
		return
	}
	if err := u.sessions.CheckCSRF(r); err != nil {
		u.errorPage(w, r, who, &pageError{http.StatusForbidden, err.Error()})
		return
	}
	f, err := parseKVForm(r, false)
	if err != nil {
		u.errorPage(w, r, who, err)
		return
	}
	cas := f.cas
	res, _, err := u.b.Write(r.Context(), az, &lodestonepb.Command{Op: &lodestonepb.Command_Delete{
		Delete: &lodestonepb.DeleteRequest{Key: []byte(f.key), Cas: &cas}}})
	if err == nil && !res.CasFailed {
		http.Redirect(w, r, Base+"kv?"+url.Values{"prefix": {parent(f.key)}, "deleted": {f.key}}.Encode(), http.StatusSeeOther)
		return
	}
	code, msg := writeError(err)
	if err == nil {
		code = http.StatusConflict
		msg = fmt.Sprintf("Not deleted: %q changed since you loaded it at index %d; look at it again first.", f.key, f.cas)
	}
	d := u.kvEditData(f.key)
	b := &built{title: "Key " + f.key, data: d, flash: []webui.Flash{{Class: "bad", Text: msg}}}
	u.render(w, "templates/kvedit.html", "layout", code, u.layout(w, r, who, "KV", b))
}

// writeError is what a refused write tells the person who sent it.
func writeError(err error) (int, string) {
	if err == nil {
		return http.StatusOK, ""
	}
	var de *acl.DeniedError
	var ie *store.InvalidError
	var re *store.RejectedError
	switch {
	case errors.As(err, &de):
		return http.StatusForbidden, "Not saved: " + de.Error()
	case errors.Is(err, acl.ErrNotFound):
		return http.StatusForbidden, "Not saved: your token no longer exists; log in again."
	case errors.As(err, &ie):
		return http.StatusBadRequest, "Not saved: " + ie.Error()
	case errors.As(err, &re):
		return http.StatusConflict, "Not saved: " + re.Detail
	}
	if st, ok := status.FromError(err); ok {
		switch st.Code() {
		case codes.InvalidArgument:
			return http.StatusBadRequest, "Not saved: " + st.Message()
		case codes.Unavailable:
			return http.StatusServiceUnavailable, "Not saved: no leader right now (" + st.Message() + "); nothing was written, try again."
		case codes.PermissionDenied:
			return http.StatusForbidden, "Not saved: " + st.Message()
		}
	}
	return http.StatusInternalServerError, "Not saved: " + err.Error()
}
