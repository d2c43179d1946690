// Package clusterid is a cluster's identity: 128 bits, written as 32
// lowercase hex digits everywhere (logs, errors, the data dir, gRPC
// metadata). How a cluster gets one and where peers check it is in
// peer/doc.go; this package only makes, prints, parses and stores it.
//
// On disk it is the file DATA_DIR/cluster-id: the 32 hex digits and a
// newline, 33 bytes, written to a temporary file, synced and renamed into
// place. A missing file means this data dir has not learned an id yet; a
// file that is not exactly that (short, long, not hex, all zeros) is an
// error, never guessed around: the server refuses to start and says what
// it found.
package clusterid

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// ID is a cluster id. The zero ID means "none" (not yet learned, or a
// snapshot written before clusters had ids); no cluster has it.
type ID [16]byte

// FileName is the id's file in a data dir.
const FileName = "cluster-id"

// String is the id as 32 lowercase hex digits, "none" for the zero ID.
func (id ID) String() string {
	if id.IsZero() {
		return "none"
	}
	return hex.EncodeToString(id[:])
}

// IsZero reports whether id is the zero ID.
func (id ID) IsZero() bool { return id == ID{} }

// Parse reads 32 hex digits; the zero ID is refused.
func Parse(s string) (ID, error) {
	var id ID
	if len(s) != 2*len(id) {
		return ID{}, fmt.Errorf("cluster id %q: want %d hex digits, got %d characters", s, 2*len(id), len(s))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return ID{}, fmt.Errorf("cluster id %q: %w", s, err)
	}
	if id.IsZero() {
		return ID{}, fmt.Errorf("cluster id %q: all zeros is not an id", s)
	}
	return id, nil
}

// FromBytes reads an id sent on the wire; nil or empty is the zero ID.
func FromBytes(b []byte) (ID, error) {
	var id ID
	if len(b) == 0 {
		return id, nil
	}
	if len(b) != len(id) {
		return ID{}, fmt.Errorf("cluster id of %d bytes, want %d", len(b), len(id))
	}
	copy(id[:], b)
	return id, nil
}

// Derive is the id of a cluster bootstrapped from initialCluster (name →
// peer address, exactly as configured) with token: the first 128 bits of
// a SHA-256 over both. Every founding member computes it alone and gets
// the same answer, so members check each other from the first message.
// Two clusters get different ids when their tokens or member lists
// differ; --cluster-token is how an operator makes sure of it.
func Derive(token string, initialCluster map[string]string) ID {
	names := make([]string, 0, len(initialCluster))
	for n := range initialCluster {
		names = append(names, n)
	}
	sort.Strings(names)
	h := sha256.New()
	fmt.Fprintf(h, "lodestone cluster id v1\x00%d:%s\x00", len(token), token)
	for _, n := range names {
		fmt.Fprintf(h, "%s=%s\n", n, initialCluster[n])
	}
	var id ID
	copy(id[:], h.Sum(nil))
	return id
}

// Random is a new random id, for a cluster no other member needs to
// agree with.
func Random() ID {
	var id ID
	for id.IsZero() {
		rand.Read(id[:]) // NB: never fails (crypto/rand panics instead)
	}
	return id
}

// Load reads dir's id file. ok is false, with no error, when there is none.
func Load(dir string) (id ID, ok bool, err error) {
	path := filepath.Join(dir, FileName)
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return ID{}, false, nil
	}
	if err != nil {
		return ID{}, false, fmt.Errorf("read %s: %w", path, err)
	}
	s, found := strings.CutSuffix(string(b), "\n")
	if !found {
		return ID{}, false, fmt.Errorf("%s is damaged (%d bytes, no final newline): it must hold the cluster id as 32 hex digits and a newline; restore it from another member's data dir", path, len(b))
	}
	if id, err = Parse(s); err != nil {
		return ID{}, false, fmt.Errorf("%s is damaged: %w; restore it from another member's data dir", path, err)
	}
	return id, true, nil
}

// Save writes dir's id file crash-safely, creating dir if need be.
func Save(dir string, id ID) error {
	if id.IsZero() {
		return errors.New("save cluster id: the zero id is not an id")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create %s: %w", dir, err)
	}
	f, err := os.CreateTemp(dir, "."+FileName+".*.tmp")
	if err != nil {
		return fmt.Errorf("save cluster id: %w", err)
	}
	tmp := f.Name()
	_, err = f.WriteString(id.String() + "\n")
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, FileName))
	}
	if err == nil {
		err = syncDir(dir)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("save cluster id in %s: %w", dir, err)
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	return err
}
