package localagent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/atomicfile"
)

// registrations are the local services and node-level checks as they were
// registered (each check with its definition's status), by key: "service/"
// and the service id, or "check/" and the check id. Values are never
// modified; a change makes a new map.
type registrations map[string]*lodestonepb.CatalogRegisterRequest

func serviceKey(id string) string { return "service/" + id }
func checkKey(id string) string   { return "check/" + id }

// with returns a copy of r with key set to reg (nil: removed).
func (r registrations) with(key string, reg *lodestonepb.CatalogRegisterRequest) registrations {
	out := maps.Clone(r)
	if out == nil {
		out = registrations{}
	}
	if reg == nil {
		delete(out, key)
	} else {
		out[key] = reg
	}
	return out
}

// withoutCheck returns a copy of r without check id, wherever it is.
func (r registrations) withoutCheck(id string) registrations {
	out := maps.Clone(r)
	delete(out, checkKey(id))
	for key, reg := range out {
		if reg.Service == nil {
			continue
		}
		if i := slices.IndexFunc(reg.Checks, func(c *lodestonepb.Check) bool { return c.CheckId == id }); i >= 0 {
			n := proto.CloneOf(reg)
			n.Checks = slices.Delete(n.Checks, i, i+1)
			out[key] = n
		}
	}
	return out
}

// file is the registrations' file format: JSON, each registration in
// protojson (the field names of api/lodestone/v1/catalog.proto).
type file struct {
	Version       int               `json:"version"`
	Registrations []json.RawMessage `json:"registrations"`
}

const fileVersion = 1

// load reads the registrations file; a missing file is none.
func (a *Agent) load() (registrations, error) {
	regs := registrations{}
	path := a.path()
	if path == "" {
		return regs, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return regs, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read local agent registrations: %w", err)
	}
	var f file
	if err := json.Unmarshal(b, &f); err != nil {
		return nil, fmt.Errorf("local agent registrations %s: %w", path, err)
	}
	if f.Version != fileVersion {
		return nil, fmt.Errorf("local agent registrations %s: version %d unsupported (this build reads %d)", path, f.Version, fileVersion)
	}
	for i, raw := range f.Registrations {
		reg := &lodestonepb.CatalogRegisterRequest{}
		if err := protojson.Unmarshal(raw, reg); err != nil {
			return nil, fmt.Errorf("local agent registrations %s: registration %d: %w", path, i, err)
		}
		switch {
		case reg.Service != nil && reg.Service.Id != "":
			regs[serviceKey(reg.Service.Id)] = reg
		case reg.Service == nil && len(reg.Checks) == 1 && reg.Checks[0].CheckId != "":
			regs[checkKey(reg.Checks[0].CheckId)] = reg
		default:
			return nil, fmt.Errorf("local agent registrations %s: registration %d is neither a service nor one check", path, i)
		}
	}
	return regs, nil
}

// persist replaces the file with regs, crash-safely.
func (a *Agent) persist(regs registrations) error {
	path := a.path()
	if path == "" {
		return nil
	}
	f := file{Version: fileVersion, Registrations: []json.RawMessage{}}
	for _, key := range slices.Sorted(maps.Keys(regs)) {
		b, err := protojson.Marshal(regs[key])
		if err != nil {
			return fmt.Errorf("encode registration %s: %w", key, err)
		}
		f.Registrations = append(f.Registrations, b)
	}
	b, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return fmt.Errorf("encode local agent registrations: %w", err)
	}
	if err := atomicfile.WriteFile(path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("save local agent registrations: %w", err)
	}
	return nil
}
