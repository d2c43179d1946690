package main

// Configuration files and the environment give a command's flags their
// values (docs/configuration.md). Every flag has a key, its name with '_'
// for '-', so a new flag gets one without a line here; hidden flags (tests
// and fault injection only), --help and --config-file have none. A value
// comes from the command line, else the environment (LODESTONE_<KEY> for
// the server, LODESTONE_GATEWAY_<KEY> for the gateway), else the last file
// that sets the key, else the flag's default.

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/agnivade/levenshtein"
	"github.com/hashicorp/hcl/hcl/ast"
	hclparser "github.com/hashicorp/hcl/hcl/parser"
	hclscanner "github.com/hashicorp/hcl/hcl/scanner"
	"github.com/hashicorp/hcl/hcl/token"
	jsonparser "github.com/hashicorp/hcl/json/parser"
	"github.com/spf13/pflag"
)

const (
	// envPrefix starts the environment variable of every server key.
	envPrefix = "LODESTONE_"
	// gatewayEnvPrefix starts the gateway's: its keys (listen, admin,
	// prefix) would mean something else to every other command.
	gatewayEnvPrefix = "LODESTONE_GATEWAY_"
	// configFileFlag names the files themselves.
	configFileFlag = "config-file"
)

// configKey is a flag's key in a file.
func configKey(flagName string) string { return strings.ReplaceAll(flagName, "-", "_") }

// envVar is a key's environment variable under prefix.
func envVar(prefix, key string) string { return prefix + strings.ToUpper(key) }

// configFlags are the flags of fs that have a key, by key.
func configFlags(fs *pflag.FlagSet) map[string]*pflag.Flag {
	out := map[string]*pflag.Flag{}
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Hidden && f.Name != "help" && f.Name != configFileFlag {
			out[configKey(f.Name)] = f
		}
	})
	return out
}

// setting is one key's value from one source.
type setting struct {
	flag   *pflag.Flag
	values []string // one, or a list's elements
	source string   // "server.hcl:3:1" or "LODESTONE_DATA_DIR"
}

// apply sets the flag; it counts as given, as on the command line.
func (s setting) apply() error {
	var err error
	if sv, ok := s.flag.Value.(pflag.SliceValue); ok {
		err = sv.Replace(s.values)
	} else {
		err = s.flag.Value.Set(s.values[0])
	}
	if err != nil {
		return err
	}
	s.flag.Changed = true
	return nil
}

// applyConfig gives every flag of fs that has a key and was not given on
// the command line its value from the environment (<prefix><KEY>) or,
// failing that, from files (a later file's key over an earlier one's). ignore lists keys
// that belong to the command itself, not to a flag. It reports every
// problem it finds; callers then drop fs, so a bad value changes nothing.
func applyConfig(fs *pflag.FlagSet, files []string, getenv func(string) string, prefix string, ignore ...string) error {
	flags := configFlags(fs)
	fromFiles, err := readConfigFiles(files, flags, ignore)
	if err != nil {
		return err
	}
	var errs []error
	for _, key := range slices.Sorted(maps.Keys(flags)) {
		f := flags[key]
		s, ok := envSetting(f, key, prefix, getenv)
		if !ok {
			s, ok = fromFiles[key]
		}
		if !ok || f.Changed {
			continue
		}
		if err := s.apply(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w (want %s)", s.source, err, kindOf(f)))
		}
	}
	return errors.Join(errs...)
}

// envSetting is key's <prefix><KEY>, if set: a list's elements are
// comma-separated.
func envSetting(f *pflag.Flag, key, prefix string, getenv func(string) string) (setting, bool) {
	name := envVar(prefix, key)
	v := getenv(name)
	if v == "" {
		return setting{}, false
	}
	values := []string{v}
	if kindOf(f) == kindList {
		values = splitList(v)
	}
	return setting{flag: f, values: values, source: fmt.Sprintf("%s=%q", name, v)}, true
}

// readConfigFiles reads files in order into settings by key.
func readConfigFiles(files []string, flags map[string]*pflag.Flag, ignore []string) (map[string]setting, error) {
	out := map[string]setting{}
	var errs []error
	for _, path := range files {
		settings, err := readConfigFile(path, flags, ignore)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, s := range settings {
			out[configKey(s.flag.Name)] = s
		}
	}
	return out, errors.Join(errs...)
}

// readConfigFile parses one file and checks its keys and the types of
// their values.
func readConfigFile(path string, flags map[string]*pflag.Flag, ignore []string) ([]setting, error) {
	list, err := parseConfigFile(path)
	if err != nil {
		return nil, err
	}
	r := fileReader{path: path, flags: flags, ignore: ignore, seen: map[string]string{}}
	r.items(list, "")
	return r.out, errors.Join(r.errs...)
}

// parseConfigFile parses path with the parser its extension names.
func parseConfigFile(path string) (*ast.ObjectList, error) {
	parse := map[string]func([]byte) (*ast.File, error){".hcl": hclparser.Parse, ".json": jsonparser.Parse}[strings.ToLower(filepath.Ext(path))]
	if parse == nil {
		return nil, fmt.Errorf("config file %s: the extension picks the format: name it .hcl or .json", path)
	}
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config file: %w", err)
	}
	f, err := parse(src)
	if err != nil {
		var pe *hclparser.PosError
		if errors.As(err, &pe) {
			return nil, fmt.Errorf("config file %s: %v", at(path, pe.Pos), pe.Err)
		}
		return nil, fmt.Errorf("config file %s: %v", path, err)
	}
	if pos, ok := danglingAssign(src); ok && strings.EqualFold(filepath.Ext(path), ".hcl") {
		return nil, fmt.Errorf("config file %s: '=' with no value after it", at(path, pos))
	}
	list, ok := f.Node.(*ast.ObjectList)
	if !ok {
		return nil, fmt.Errorf("config file %s: want keys and values at the top", path)
	}
	return list, nil
}

// danglingAssign finds a last "key =" with no value, which the HCL
// parser drops without a word.
func danglingAssign(src []byte) (token.Pos, bool) {
	sc := hclscanner.New(src)
	sc.Error = func(token.Pos, string) {} // NB: the parser reported errors already
	var last token.Token
	for tok := sc.Scan(); tok.Type != token.EOF; tok = sc.Scan() {
		if tok.Type != token.COMMENT {
			last = tok
		}
	}
	return last.Pos, last.Type == token.ASSIGN
}

// at is a position in a file as editors take it.
func at(path string, p token.Pos) string {
	if p.Line == 0 {
		return path
	}
	return fmt.Sprintf("%s:%d:%d", path, p.Line, p.Column)
}

// fileReader turns one file's items into settings.
type fileReader struct {
	path   string
	flags  map[string]*pflag.Flag
	ignore []string
	seen   map[string]string // key: where it was set first
	out    []setting
	errs   []error
}

// items reads a list of items; a block's keys get its name and '_' in
// front (tls { ca_file = ... } is tls_ca_file).
func (r *fileReader) items(list *ast.ObjectList, prefix string) {
	for _, item := range list.Items {
		key, where := r.itemKey(item, prefix)
		if obj, ok := item.Val.(*ast.ObjectType); ok && !slices.Contains(r.ignore, key) {
			r.items(obj.List, key+"_")
			continue
		}
		r.item(item, key, where)
	}
}

// itemKey is an item's key (its labels joined by '_') and position. A
// JSON key has no position of its own; its colon has.
func (r *fileReader) itemKey(item *ast.ObjectItem, prefix string) (string, string) {
	parts := make([]string, len(item.Keys))
	for i, k := range item.Keys {
		parts[i] = k.Token.Text
		if k.Token.Type == token.STRING {
			parts[i], _ = stringOf(k.Token)
		}
	}
	pos := item.Assign
	if len(item.Keys) > 0 && item.Keys[0].Token.Pos.IsValid() {
		pos = item.Keys[0].Token.Pos
	}
	return prefix + strings.Join(parts, "_"), at(r.path, pos)
}

func (r *fileReader) item(item *ast.ObjectItem, key, where string) {
	if slices.Contains(r.ignore, key) {
		return
	}
	f, ok := r.flags[key]
	if !ok {
		r.errs = append(r.errs, unknownKey(key, where, r.flags))
		return
	}
	if first, dup := r.seen[key]; dup {
		r.errs = append(r.errs, fmt.Errorf("key %s at %s is set again (first at %s): give each key once", key, where, first))
		return
	}
	r.seen[key] = where
	values, err := valuesOf(item.Val, kindOf(f))
	if err != nil {
		r.errs = append(r.errs, fmt.Errorf("key %s at %s: %w", key, where, err))
		return
	}
	r.out = append(r.out, setting{flag: f, values: values, source: "key " + key + " at " + where})
}

// unknownKey names the nearest key when one is close enough to be a typo.
func unknownKey(key, where string, flags map[string]*pflag.Flag) error {
	best, bestDist := "", -1
	for k := range flags {
		if d := levenshtein.ComputeDistance(key, k); bestDist < 0 || d < bestDist || d == bestDist && k < best {
			best, bestDist = k, d
		}
	}
	if bestDist >= 0 && bestDist <= max(2, len(key)/4) {
		return fmt.Errorf("unknown key %s at %s: did you mean %s?", key, where, best)
	}
	return fmt.Errorf("unknown key %s at %s: keys are the command's flag names with '_' for '-' (see --help)", key, where)
}

// valueKind is what a key's value must be, by its flag's type.
type valueKind int

const (
	kindString valueKind = iota
	kindBool
	kindInt
	kindFloat
	kindDuration
	kindList
)

func kindOf(f *pflag.Flag) valueKind {
	if _, ok := f.Value.(pflag.SliceValue); ok {
		return kindList
	}
	switch f.Value.Type() {
	case "bool":
		return kindBool
	case "int", "int8", "int16", "int32", "int64", "uint", "uint8", "uint16", "uint32", "uint64":
		return kindInt
	case "float32", "float64":
		return kindFloat
	case "duration":
		return kindDuration
	}
	return kindString
}

func (k valueKind) String() string {
	return [...]string{
		kindString:   "a string",
		kindBool:     "true or false",
		kindInt:      "an integer",
		kindFloat:    "a number",
		kindDuration: `a duration in a string, such as "5s"`,
		kindList:     `a list of strings, such as ["a", "b"]`,
	}[k]
}

// valuesOf checks that n is a value of kind k and returns it as the
// flag's Set (or a list's Replace) takes it.
func valuesOf(n ast.Node, k valueKind) ([]string, error) {
	if k == kindList {
		return listOf(n)
	}
	lit, ok := n.(*ast.LiteralType)
	if !ok || !literalFits(lit.Token.Type, k) {
		return nil, fmt.Errorf("got %s, want %s", describe(n), k)
	}
	if k == kindString || k == kindDuration {
		s, err := stringOf(lit.Token)
		return []string{s}, err
	}
	return []string{lit.Token.Text}, nil
}

// literalFits reports whether a literal of type t is a value of kind k.
func literalFits(t token.Type, k valueKind) bool {
	switch k {
	case kindBool:
		return t == token.BOOL
	case kindInt:
		return t == token.NUMBER
	case kindFloat:
		return t == token.NUMBER || t == token.FLOAT
	}
	return t == token.STRING || t == token.HEREDOC
}

func listOf(n ast.Node) ([]string, error) {
	list, ok := n.(*ast.ListType)
	if !ok {
		return nil, fmt.Errorf("got %s, want %s", describe(n), kindList)
	}
	out := make([]string, 0, len(list.List))
	for i, e := range list.List {
		lit, ok := e.(*ast.LiteralType)
		if !ok || !literalFits(lit.Token.Type, kindString) {
			return nil, fmt.Errorf("element %d: got %s, want a string", i+1, describe(e))
		}
		s, err := stringOf(lit.Token)
		if err != nil {
			return nil, err
		}
		out = append(out, s)
	}
	return out, nil
}

// describe names what a value is, for errors.
func describe(n ast.Node) string {
	switch v := n.(type) {
	case *ast.ListType:
		return "a list"
	case *ast.ObjectType:
		return "a block"
	case *ast.LiteralType:
		switch v.Token.Type {
		case token.NUMBER:
			return "an integer"
		case token.FLOAT:
			return "a number"
		case token.BOOL:
			return "a bool"
		case token.STRING, token.HEREDOC:
			return "a string"
		}
	}
	return "a value of another kind"
}

// stringOf unquotes a string literal (the parser checked it; Value panics
// on what it did not).
func stringOf(t token.Token) (s string, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("string %s: %v", t.Text, r)
		}
	}()
	v, _ := t.Value().(string)
	return v, nil
}

// commandLine is the flags given on a command line, kept to give them
// again over a fresh FlagSet (a reload re-reads everything else).
type commandLine []given

type given struct {
	name   string
	values []string // one, or a list's elements
}

// recordCommandLine keeps the flags of fs given on the command line.
func recordCommandLine(fs *pflag.FlagSet) commandLine {
	var line commandLine
	// NB: VisitAll and Changed: Visit misses the flags of a set made by
	// cobra's LocalFlags, which never saw the parse.
	fs.VisitAll(func(f *pflag.Flag) {
		if !f.Changed {
			return
		}
		if sv, ok := f.Value.(pflag.SliceValue); ok {
			line = append(line, given{f.Name, sv.GetSlice()})
			return
		}
		line = append(line, given{f.Name, []string{f.Value.String()}})
	})
	return line
}

// replay gives line's flags to fs.
func (line commandLine) replay(fs *pflag.FlagSet) error {
	for _, g := range line {
		f := fs.Lookup(g.name)
		if f == nil {
			return fmt.Errorf("flag --%s: not a flag of this command", g.name)
		}
		if err := (setting{flag: f, values: g.values, source: "--" + g.name}).apply(); err != nil {
			return fmt.Errorf("--%s: %w", g.name, err)
		}
	}
	return nil
}

// flagValues are the values of fs's flags that have a key, by key, as
// text to compare.
func flagValues(fs *pflag.FlagSet) map[string]string {
	out := map[string]string{}
	for key, f := range configFlags(fs) {
		out[key] = f.Value.String()
	}
	return out
}
