package gateway

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"
)

func samplePersisted() persisted {
	return persisted{
		Index:   812,
		SavedAt: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		Routes:  []Route{{Name: "web", PathPrefix: "/", Service: "web"}},
		Instances: []Instance{
			{Service: "web", ID: "a", Address: "10.0.0.1", Port: 80, Healthy: true},
			{Service: "web", ID: "b", Address: "10.0.0.2", Port: 80, Healthy: true, Meta: map[string]string{"protocol": "h2c"}},
		},
	}
}

func TestPersistRoundTrip(t *testing.T) {
	dir := t.TempDir()
	p := samplePersisted()
	if err := saveTable(dir, p); err != nil {
		t.Fatal(err)
	}
	got, err := loadTable(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, p) {
		t.Fatalf("loaded %+v, want %+v", got, p)
	}
	if _, err := os.Stat(filepath.Join(dir, TableFile+".tmp")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("temp file left behind: %v", err)
	}
	// The table rebuilt from the file routes like the one saved.
	env := bareEnv(4, 25, 1, 1)
	tb, _ := emptyTable(nil, env).apply(p.update(), env)
	if got := tb.snapshot(p.SavedAt); !reflect.DeepEqual(got, p) {
		t.Fatalf("snapshot of the rebuilt table %+v, want %+v", got, p)
	}
}

// TestPersistCorruption: every damaged file is refused with
// ErrCorruptState; a stray temp file (a crash mid-write) is ignored.
func TestPersistCorruption(t *testing.T) {
	good, err := samplePersisted().encode()
	if err != nil {
		t.Fatal(err)
	}
	nl := bytes.IndexByte(good, '\n')
	flip := bytes.Clone(good)
	flip[nl+10] ^= 0x01
	for _, tc := range []struct {
		name string
		b    []byte
	}{
		{"empty", nil},
		{"no header", []byte(`{"index": 1}`)},
		{"bad magic", append([]byte("something-else 1 00000000 2\n"), "{}"...)},
		{"future format", bytes.Replace(good, []byte("table 1 "), []byte("table 9 "), 1)},
		{"truncated", good[:len(good)-7]},
		{"bit flip", flip},
		{"bad json with a good checksum", func() []byte {
			p := persisted{}
			b, _ := p.encode()
			return bytes.Replace(b, []byte(`"index":0`), []byte(`"index":x`), 1)
		}()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := decodeTable(tc.b); !errors.Is(err, ErrCorruptState) {
				t.Fatalf("decode = %v, want ErrCorruptState", err)
			}
		})
	}

	dir := t.TempDir()
	if _, err := loadTable(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("load of a missing table = %v, want ErrNotExist", err)
	}
	if err := saveTable(dir, samplePersisted()); err != nil {
		t.Fatal(err)
	}
	// A crash between writing the temp file and the rename leaves both.
	if err := os.WriteFile(filepath.Join(dir, TableFile+".tmp"), good[:20], 0o644); err != nil {
		t.Fatal(err)
	}
	if got, err := loadTable(dir); err != nil || got.Index != 812 {
		t.Fatalf("load with a stray temp file = %v, %v; want the last good table", got.Index, err)
	}
	next := samplePersisted()
	next.Index = 900
	if err := saveTable(dir, next); err != nil {
		t.Fatal(err)
	}
	if got, err := loadTable(dir); err != nil || got.Index != 900 {
		t.Fatalf("load after overwrite = %v, %v; want 900", got.Index, err)
	}
}
