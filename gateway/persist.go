package gateway

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"
)

// The persisted routing table (StateDir/TableFile) is what lets a gateway
// cold-start while the registry is down: the last known good instances and
// registry routes with the registry index they were current at.
//
// Layout: one header line, then the JSON body.
//
//	lodestone-gateway-table <format> <crc32c of body, 8 hex digits> <body length>\n
//	{"index": 812, "saved_at": "2025-…", "routes": [Route…], "instances": [Instance…]}
//
// Writes are crash-safe (STYLE rule 10): write a temp file in the same
// directory, fsync it, rename it over the table, fsync the directory. A
// crash leaves either the old file or the new one, never a mix; a stray
// temp file is ignored and overwritten by the next write.
//
// Assumptions: rename within a directory is atomic and, after the
// directory's fsync, durable (POSIX local file systems). Not defended
// against: a disk that lies about fsync; two gateways sharing a StateDir.

// TableFile is the persisted table's file name inside StateDir.
const TableFile = "gateway-table"

const (
	tableMagic  = "lodestone-gateway-table"
	tableFormat = 1
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// persisted is the table's on-disk body.
type persisted struct {
	Index     uint64     `json:"index"`
	SavedAt   time.Time  `json:"saved_at"`
	Routes    []Route    `json:"routes"`
	Instances []Instance `json:"instances"`
}

// snapshot captures t's registry state (static routes are not saved: they
// come from the routes file).
func (t *table) snapshot(now time.Time) persisted {
	p := persisted{Index: t.index, SavedAt: now, Routes: []Route{}, Instances: []Instance{}}
	for _, name := range slices.Sorted(maps.Keys(t.routes)) {
		p.Routes = append(p.Routes, t.routes[name].Route)
	}
	for _, name := range slices.Sorted(maps.Keys(t.services)) {
		s := t.services[name]
		for _, id := range slices.Sorted(maps.Keys(s.members)) {
			p.Instances = append(p.Instances, s.members[id].inst)
		}
	}
	return p
}

// update turns p into the Reset update that rebuilds its table.
func (p persisted) update() Update {
	u := Update{Index: p.Index, Reset: true}
	for _, r := range p.Routes {
		u.Routes = append(u.Routes, RouteChange{Name: r.Name, Route: &r})
	}
	for _, in := range p.Instances {
		u.Instances = append(u.Instances, InstanceChange{Service: in.Service, ID: in.ID, Instance: &in})
	}
	return u
}

// encode renders the file's bytes.
func (p persisted) encode() ([]byte, error) {
	body, err := json.Marshal(p)
	if err != nil {
		return nil, fmt.Errorf("encode table: %w", err)
	}
	var b bytes.Buffer
	fmt.Fprintf(&b, "%s %d %08x %d\n", tableMagic, tableFormat, crc32.Checksum(body, castagnoli), len(body))
	b.Write(body)
	return b.Bytes(), nil
}

// decodeTable parses the file's bytes; every failure wraps ErrCorruptState.
func decodeTable(b []byte) (persisted, error) {
	var p persisted
	corrupt := func(format string, args ...any) (persisted, error) {
		return p, fmt.Errorf("%w: %s", ErrCorruptState, fmt.Sprintf(format, args...))
	}
	nl := bytes.IndexByte(b, '\n')
	if nl < 0 {
		return corrupt("no header line")
	}
	f := bytes.Fields(b[:nl])
	if len(f) != 4 || string(f[0]) != tableMagic {
		return corrupt("bad header %q", b[:nl])
	}
	if string(f[1]) != strconv.Itoa(tableFormat) {
		return corrupt("unknown format %s (this gateway reads %d)", f[1], tableFormat)
	}
	sum, err1 := strconv.ParseUint(string(f[2]), 16, 32)
	n, err2 := strconv.Atoi(string(f[3]))
	if err1 != nil || err2 != nil {
		return corrupt("bad header %q", b[:nl])
	}
	body := b[nl+1:]
	if len(body) != n {
		return corrupt("body is %d bytes, header says %d", len(body), n)
	}
	if got := crc32.Checksum(body, castagnoli); got != uint32(sum) {
		return corrupt("checksum %08x, header says %08x", got, sum)
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return corrupt("decode body: %v", err)
	}
	return p, nil
}

// saveTable writes p to dir/TableFile crash-safely.
func saveTable(dir string, p persisted) error {
	b, err := p.encode()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create state dir: %w", err)
	}
	tmp := filepath.Join(dir, TableFile+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return fmt.Errorf("create temp table: %w", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return fmt.Errorf("write temp table: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("fsync temp table: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close temp table: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, TableFile)); err != nil {
		return fmt.Errorf("rename temp table: %w", err)
	}
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("open state dir: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("fsync state dir: %w", err)
	}
	return nil
}

// loadTable reads dir/TableFile. A missing file returns an error matching
// os.ErrNotExist; a damaged one, ErrCorruptState.
func loadTable(dir string) (persisted, error) {
	b, err := os.ReadFile(filepath.Join(dir, TableFile))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return persisted{}, err
		}
		return persisted{}, fmt.Errorf("read table: %w", err)
	}
	return decodeTable(b)
}
