package consulapi

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/lodestone-kv/lodestone/acl"
	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/snapfile"
)

// /v1/snapshot: GET saves, PUT restores, in Lodestone's snapshot file
// format (internal/snapfile, the file `lodestone snapshot save` writes),
// not Consul's gzipped tar: Consul's client streams the bytes either way,
// so api.Snapshot().Save and Restore round-trip, and a file saved through
// either door restores through the other. Both need acl:write, as Consul's
// snapshots need a management token: the state holds every token.

// Snapshotter is what /v1/snapshot needs from the node beside Backend. A
// Backend that does not implement it answers 501.
type Snapshotter interface {
	// SaveSnapshot returns the state as of a linearizable read, encoded
	// as a store snapshot stream, with the file header describing it.
	SaveSnapshot(ctx context.Context) (*lodestonepb.SavedSnapshotHeader, []byte, error)
}

// MaxRestoreBytes bounds a PUT /v1/snapshot body: the state travels to
// every member as one Raft entry, and a Raft message is at most 64 MiB. A
// larger state restores offline, into a new cluster, with `lodestone
// snapshot restore`.
const MaxRestoreBytes = 32 << 20

func (a *API) registerSnapshot(handle func(string, func(http.ResponseWriter, *http.Request) error)) {
	handle("GET /v1/snapshot", a.snapshotSave)
	handle("PUT /v1/snapshot", a.snapshotRestore)
}

// snapshotter checks acl:write and returns the node's Snapshotter.
func (a *API) snapshotter(r *http.Request) (Snapshotter, error) {
	az, err := a.authorizer(r)
	if err != nil {
		return nil, err
	}
	if err := az.Check(acl.ResourceACL, "", acl.AccessWrite); err != nil {
		return nil, err
	}
	sn, ok := a.b.(Snapshotter)
	if !ok {
		return nil, &httpError{http.StatusNotImplemented, "snapshots are not served by this node"}
	}
	return sn, nil
}

func (a *API) snapshotSave(w http.ResponseWriter, r *http.Request) error {
	sn, err := a.snapshotter(r)
	if err != nil {
		return err
	}
	hdr, data, err := sn.SaveSnapshot(r.Context())
	if err != nil {
		return err
	}
	var file bytes.Buffer
	file.Grow(len(data) + 4096)
	if err := snapfile.Write(&file, hdr, data); err != nil {
		return err
	}
	a.setMeta(w, hdr.Index)
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.Itoa(file.Len()))
	_, err = w.Write(file.Bytes())
	a.logger.Info("snapshot saved over http", "index", hdr.Index, "bytes", file.Len())
	return err
}

// snapshotRestore replaces the state with the snapshot in the body, through
// the log (store/restore.go): only a snapshot of this cluster, at an index
// it has passed, restores; anything else is refused and changes nothing.
func (a *API) snapshotRestore(w http.ResponseWriter, r *http.Request) error {
	if _, err := a.snapshotter(r); err != nil {
		return err
	}
	if r.ContentLength > MaxRestoreBytes {
		return a.tooLarge("max-restore-bytes", "Snapshot of %d bytes too large, max size: %d bytes; restore it offline with 'lodestone snapshot restore'", r.ContentLength, MaxRestoreBytes)
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, MaxRestoreBytes+1))
	if mbe := (*http.MaxBytesError)(nil); errors.As(err, &mbe) {
		return a.tooLarge("max-restore-bytes", "Snapshot too large, max size: %d bytes", mbe.Limit)
	}
	if err != nil {
		return badRequest("read request body: %v", err)
	}
	if len(body) > MaxRestoreBytes {
		return a.tooLarge("max-restore-bytes", "Snapshot too large, max size: %d bytes; restore it offline with 'lodestone snapshot restore'", MaxRestoreBytes)
	}
	f, err := snapfile.Parse(body)
	if err != nil {
		// NB: Consul refuses a bad archive in its RPC layer: a 500.
		return consulError("failed to read snapshot: %v", err)
	}
	res, index, err := a.apply(r, &lodestonepb.Command{Op: &lodestonepb.Command_Restore{Restore: &lodestonepb.StateRestore{State: f.Data}}})
	if err != nil {
		return err
	}
	a.setMeta(w, index)
	a.logger.Info("snapshot restored over http", "index", index, "snapshot_index", res.GetRestore().GetSnapshotIndex(), "bytes", len(body))
	w.WriteHeader(http.StatusOK)
	return nil
}
