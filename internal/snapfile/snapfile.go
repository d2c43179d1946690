// Package snapfile encodes and checks the operator's snapshot file
// (tools/snapshot/FORMAT.md): a header naming the index, term and members,
// one store snapshot stream, and the SHA-256 of everything before it. The
// CLI writes and reads such files (tools/snapshot), and the Consul API's
// /v1/snapshot answers and takes the same bytes, so a file saved either
// way restores either way.
package snapfile

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"io"

	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// The layout, version 1. All integers big-endian.
//
//	0        magic    [8]byte  "LDSTBKUP"
//	8        version  uint32   1
//	12       hlen     uint32   header length, at most MaxHeaderBytes
//	16       header   lodestone.v1.SavedSnapshotHeader (deterministic protobuf)
//	16+hlen  data     header.size bytes: one store snapshot stream
//	end-32   sha256   [32]byte SHA-256 of every byte before it
//
// The file is complete only with its checksum: a file cut anywhere is
// refused as truncated, a changed byte as a checksum mismatch.
const (
	Magic          = "LDSTBKUP"
	Version        = 1
	HeaderLen      = 16
	MaxHeaderBytes = 1 << 20
)

// Damage says what is wrong with bytes that are not a complete, intact
// snapshot file. Err, if set, is the decoder's error.
type Damage struct {
	Reason string
	Err    error
}

func (d *Damage) Error() string {
	if d.Err != nil {
		return d.Reason + ": " + d.Err.Error()
	}
	return d.Reason
}

func (d *Damage) Unwrap() error { return d.Err }

// EncodeHeader returns the bytes of the file before the data.
func EncodeHeader(h *lodestonepb.SavedSnapshotHeader) ([]byte, error) {
	hb, err := proto.MarshalOptions{Deterministic: true}.Marshal(h)
	if err != nil {
		return nil, fmt.Errorf("encode snapshot header: %w", err)
	}
	out := make([]byte, HeaderLen, HeaderLen+len(hb))
	copy(out, Magic)
	binary.BigEndian.PutUint32(out[8:], Version)
	binary.BigEndian.PutUint32(out[12:], uint32(len(hb)))
	return append(out, hb...), nil
}

// Write writes a whole file holding data, described by h (h.Size is set
// to len(data)).
func Write(w io.Writer, h *lodestonepb.SavedSnapshotHeader, data []byte) error {
	h.Size = uint64(len(data))
	prefix, err := EncodeHeader(h)
	if err != nil {
		return err
	}
	sum := sha256.New()
	out := io.MultiWriter(w, sum)
	if _, err := out.Write(prefix); err != nil {
		return err
	}
	if _, err := out.Write(data); err != nil {
		return err
	}
	_, err = w.Write(sum.Sum(nil))
	return err
}

// File is a parsed, verified snapshot file. Data aliases the bytes parsed.
type File struct {
	Header *lodestonepb.SavedSnapshotHeader
	Data   []byte
	Sum    [32]byte
	Size   int64
}

// Parse checks b's layout, lengths and checksum. It does not decode the
// state. A problem is a *Damage.
func Parse(b []byte) (*File, error) {
	bad := func(format string, args ...any) error { return &Damage{Reason: fmt.Sprintf(format, args...)} }
	if len(b) < HeaderLen {
		return nil, bad("truncated: %d bytes, shorter than the %d-byte file header", len(b), HeaderLen)
	}
	if string(b[:8]) != Magic {
		return nil, bad("bad magic %q, want %q (not a lodestone snapshot file)", b[:8], Magic)
	}
	if v := binary.BigEndian.Uint32(b[8:]); v != Version {
		return nil, bad("version %d unsupported (this build reads version %d)", v, Version)
	}
	hlen := int(binary.BigEndian.Uint32(b[12:]))
	if hlen > MaxHeaderBytes {
		return nil, bad("header length %d exceeds %d", hlen, MaxHeaderBytes)
	}
	if len(b) < HeaderLen+hlen {
		return nil, bad("truncated: %d bytes, the header alone needs %d", len(b), HeaderLen+hlen)
	}
	h := &lodestonepb.SavedSnapshotHeader{}
	if err := proto.Unmarshal(b[HeaderLen:HeaderLen+hlen], h); err != nil {
		return nil, &Damage{Reason: "undecodable header", Err: err}
	}
	want := uint64(HeaderLen+hlen) + h.GetSize() + sha256.Size
	switch {
	case uint64(len(b)) < want:
		return nil, bad("truncated: %d bytes, the header promises %d (%d bytes of state and a 32-byte checksum)", len(b), want, h.GetSize())
	case uint64(len(b)) > want:
		return nil, bad("%d unexpected bytes after the checksum", uint64(len(b))-want)
	}
	body := b[:len(b)-sha256.Size]
	got := sha256.Sum256(body)
	var stored [32]byte
	copy(stored[:], b[len(b)-sha256.Size:])
	if got != stored {
		return nil, bad("checksum mismatch: stored %s, contents hash to %s", hex.EncodeToString(stored[:8]), hex.EncodeToString(got[:8]))
	}
	return &File{Header: h, Data: body[HeaderLen+hlen:], Sum: stored, Size: int64(len(b))}, nil
}
