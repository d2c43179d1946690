package clusterid

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestDeriveAgreesAndDiffers(t *testing.T) {
	a := Derive("tok", map[string]string{"n1": "h1:1", "n2": "h2:1", "n3": "h3:1"})
	b := Derive("tok", map[string]string{"n3": "h3:1", "n1": "h1:1", "n2": "h2:1"})
	if a != b || a.IsZero() {
		t.Fatalf("same cluster, ids %s and %s", a, b)
	}
	if c := Derive("other", map[string]string{"n1": "h1:1", "n2": "h2:1", "n3": "h3:1"}); c == a {
		t.Fatal("another token gave the same id")
	}
	if c := Derive("tok", map[string]string{"n1": "h1:1", "n2": "h2:1", "n3": "h3:2"}); c == a {
		t.Fatal("another member address gave the same id")
	}
}

func TestSaveLoad(t *testing.T) {
	dir := t.TempDir()
	if _, ok, err := Load(dir); ok || err != nil {
		t.Fatalf("empty dir: ok %v err %v", ok, err)
	}
	id := Random()
	if err := Save(dir, id); err != nil {
		t.Fatal(err)
	}
	got, ok, err := Load(dir)
	if err != nil || !ok || got != id {
		t.Fatalf("load: %s %v %v, want %s", got, ok, err, id)
	}
	for _, bad := range []string{"", "abc\n", strings.Repeat("0", 32) + "\n", strings.Repeat("g", 32) + "\n", id.String()} {
		if err := os.WriteFile(filepath.Join(dir, FileName), []byte(bad), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, _, err := Load(dir); err == nil || !strings.Contains(err.Error(), "damaged") {
			t.Errorf("file %q: err %v, want damaged", bad, err)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add(Random().String())
	f.Add("")
	f.Add(strings.Repeat("0", 32))
	f.Fuzz(func(t *testing.T, s string) {
		id, err := Parse(s)
		if err != nil {
			return
		}
		if id.IsZero() || id.String() != strings.ToLower(s) {
			t.Fatalf("Parse(%q) = %s", s, id)
		}
	})
}
