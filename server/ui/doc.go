// Package ui is the server's built-in web UI, served under /ui/ on every
// server's HTTP port (--ui, on by default): pages for the 3 a.m. operator
// that show what Lodestone measures without reading /metrics by hand.
//
// # Pages
//
//	/ui/cluster    members: role, term, commit and applied index, last contact,
//	               append-ack lag per follower, fsync and commit p99, leader
//	               changes, reachability; quorum; the admission ramp
//	/ui/raftlog    each member's raft.db: size, live bytes, free pages and
//	               freelist bytes, the last commit's written bytes, journal
//	               checkpoints, rotations, snapshot index; a warning with the
//	               runbook's commands when a file is past the rotation threshold
//	/ui/watches    streams and watchers per shard, delivery lag percentiles,
//	               watchers cut loose, blocking queries parked
//	/ui/services   the catalog with health, filtered by name, tag and state;
//	               /ui/services/{name}, /ui/nodes/{node} with checks and output
//	/ui/kv         browse by prefix, view, create, edit with CAS, delete; the
//	               session holding a lock
//	/ui/sessions   sessions and the locks they hold
//
// Pages are rendered on the server with html/template from files embedded
// in the binary; the only script (internal/webui) keeps each page's live
// region current from a server-sent event stream, /ui/events/{page}. Charts
// are inline SVG (internal/svgchart). Nothing is fetched from elsewhere.
//
// # Live values without polling everything
//
// The data pages (services, nodes, KV, sessions) wait on the watch hub for
// exactly what they show, as a Consul blocking query does
// (Backend.Wait): a stream re-renders only when that data's index moves.
// The metrics pages re-render from a sample of the members' metrics taken
// at most once a second while a page is open (internal/promwin), and from
// leader changes; absence of a member is noticed by its sample failing,
// which no event could announce. A stream sends a region only when it
// differs from what it sent last. No page proposes anything: an open UI
// adds no Raft writes; only the KV forms write, through Backend.Write.
//
// # Who sees what
//
// Without ACLs every page is open. With ACLs on, a page needs a login: the
// token's secret, kept in an HttpOnly, SameSite=Strict cookie; each
// request resolves it through Backend.Authorize and reads through the same
// acl.Filter* functions as the API, so a token sees only what it may read;
// writes pass acl.CheckCommand in Backend.Write, as the API's do. The
// metrics pages show what /metrics shows (counts and states, never keys
// or values) to any logged-in token. Forms that write carry a CSRF token
// (internal/webui).
//
// # What it needs
//
// Backend (backend.go), which the server implements over its Raft node,
// store, watch hub and registry. The package reaches nothing else.
package ui
