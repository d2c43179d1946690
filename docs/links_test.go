package docs

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode"
)

// TestMarkdownReferences checks every Markdown file of the repository
// against the rules in doc.go: links relative and resolving inside the
// repository (anchors included), backticked repository paths and
// Markdown file names existing, no site addresses, and no mention of the
// directory beside the repository that a clone lacks. On failure it lists
// every offending reference as file:line.
func TestMarkdownReferences(t *testing.T) {
	root := repoRoot(t)
	files := markdownFiles(t, root)
	if len(files) < 10 {
		t.Fatalf("found %d Markdown files under %s; want the README, docs/ and the package READMEs", len(files), root)
	}
	c := newChecker(root)
	for _, f := range files {
		for _, p := range c.check(f) {
			t.Error(p)
		}
	}
}

// TestArchitectureIsLinked checks that the architecture document exists
// and that the README links it and the results file, the two places a
// reader of the README is sent for what the README leaves out.
func TestArchitectureIsLinked(t *testing.T) {
	root := repoRoot(t)
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"](docs/architecture.md)", "](bench/RESULTS.md)"} {
		if !strings.Contains(string(readme), want) {
			t.Errorf("README.md has no link %q", want)
		}
	}
}

// TestChecker runs the checker on small files written for each rule, so a
// rule that stops catching what it should fails here and not silently.
func TestChecker(t *testing.T) {
	tests := []struct {
		name string
		file string // path of the file under test, relative to the root
		text string
		want []string // substrings of the problems, in order; none if clean
	}{
		{name: "relative link to a file", file: "a/x.md", text: "see [b](../b/y.md)\n"},
		{name: "relative link to a directory", file: "a/x.md", text: "see [b](../b)\n"},
		{name: "missing file", file: "a/x.md", text: "see [z](z.md)\n", want: []string{`link "z.md": a/z.md does not exist`}},
		{name: "escapes the root", file: "a/x.md", text: "[up](../../outside.md)\n", want: []string{"leaves the repository"}},
		{name: "external link", file: "a/x.md", text: "[site](https://example.org/page)\n", want: []string{"points outside the repository"}},
		{name: "absolute link", file: "a/x.md", text: "[abs](/etc/passwd)\n", want: []string{"absolute"}},
		{name: "reference definition", file: "a/x.md", text: "[r]: http://example.org\n", want: []string{"points outside the repository"}},
		{name: "anchor in the same file", file: "b/y.md", text: "# Top\n\n## The `raft.wal` file\n\n[t](#the-raftwal-file)\n"},
		{name: "missing anchor", file: "b/y.md", text: "# Top\n\n[t](#nowhere)\n", want: []string{`anchor "#nowhere"`}},
		{name: "anchor in another file", file: "a/x.md", text: "[b](../b/y.md#second)\n"},
		{name: "duplicate heading anchor", file: "b/y.md", text: "## Run\n\n## Run\n\n[t](#run-1)\n"},
		{name: "link inside code is no link", file: "a/x.md", text: "`[z](z.md)`\n\n```\n[z](http://example.org)\n```\n"},
		{name: "backticked path exists", file: "a/x.md", text: "the file `b/y.md` and the dir `b/`\n"},
		{name: "backticked path missing", file: "a/x.md", text: "the file `b/gone.go`\n", want: []string{"`b/gone.go` does not exist"}},
		{name: "backticked path below the file's directory", file: "b/y.md", text: "`sub/z.go`\n"},
		{name: "backticked placeholder is no path", file: "a/x.md", text: "`b/<id>/x` `b/*.md` `b/{x,y}`\n"},
		{name: "backticked key is no path", file: "a/x.md", text: "`_lodestone/admission` `/v1/kv/` `w/`\n"},
		{name: "backticked md name missing", file: "a/x.md", text: "`DESIGN.md`\n", want: []string{"`DESIGN.md` does not exist"}},
		{name: "md name in prose", file: "a/x.md", text: "as DESIGN.md says\n", want: []string{"DESIGN.md does not exist"}},
		{name: "md name in prose resolves upward", file: "b/sub/q.md", text: "see y.md\n"},
		{name: "site address in prose", file: "a/x.md", text: "from https://github.com/x/y\n", want: []string{"site address"}},
		{name: "local address in prose", file: "a/x.md", text: "curl http://127.0.0.1:8500/v1/kv/x and http://localhost:1/ and $URL\n"},
		{name: "banned words in a code block", file: "a/x.md", text: "```\ncat ../shared/DESIGN.md\n```\n", want: []string{`"../shared"`, `"shared/DESIGN"`}},
		{name: "seeds", file: "a/x.md", text: "in `seeds/outage.txt`\n", want: []string{`"seeds/"`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			write := func(rel, text string) {
				t.Helper()
				p := filepath.Join(root, rel)
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write("b/y.md", "# Top\n\n## Second\n")
			write("b/sub/z.go", "package sub\n")
			write(tt.file, tt.text)
			got := newChecker(root).check(filepath.Join(root, tt.file))
			if len(got) != len(tt.want) {
				t.Fatalf("got %d problems %q, want %d like %q", len(got), got, len(tt.want), tt.want)
			}
			for i, w := range tt.want {
				if !strings.Contains(got[i], w) {
					t.Errorf("problem %d: got %q, want it to contain %q", i, got[i], w)
				}
			}
		})
	}
}

// repoRoot is the directory holding the main module's go.mod, found from
// the test's working directory (this package's directory) upwards.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	for {
		b, err := os.ReadFile(filepath.Join(dir, "go.mod"))
		if err == nil && strings.Contains(string(b), "module github.com/lodestone-kv/lodestone\n") {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("no go.mod of github.com/lodestone-kv/lodestone above the test's directory")
		}
		dir = parent
	}
}

// markdownFiles lists every *.md under root, skipping directories whose
// names start with a dot (.git).
func markdownFiles(t *testing.T, root string) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && p != root && strings.HasPrefix(d.Name(), ".") {
			return filepath.SkipDir
		}
		if !d.IsDir() && strings.HasSuffix(d.Name(), ".md") {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// checker holds the root and what it has read of the files it resolved
// anchors in.
type checker struct {
	root     string
	rootDirs map[string]bool     // names of the entries at the root
	headings map[string][]string // file → its heading slugs
}

func newChecker(root string) *checker {
	c := &checker{root: root, rootDirs: map[string]bool{}, headings: map[string][]string{}}
	if ents, err := os.ReadDir(root); err == nil {
		for _, e := range ents {
			c.rootDirs[e.Name()] = true
		}
	}
	return c
}

// banned are words that name the directory beside the repository.
var banned = []string{"../shared", "shared/DESIGN", "seeds/"}

var (
	linkRE    = regexp.MustCompile(`!?\[[^\]]*\]\(\s*<?([^)\s>]*)>?(?:\s+[^)]*)?\)`)
	refDefRE  = regexp.MustCompile(`^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)`)
	mdNameRE  = regexp.MustCompile(`(?:^|[^\w./-])([\w./-]*\w\.md)\b`)
	urlRE     = regexp.MustCompile(`[a-zA-Z][a-zA-Z0-9+.-]*://([^/\s)>\]"'` + "`" + `]*)`)
	schemeRE  = regexp.MustCompile(`^[a-zA-Z][a-zA-Z0-9+.-]*:`)
	headingRE = regexp.MustCompile(`^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$`)
	fenceRE   = regexp.MustCompile("^ {0,3}(```+|~~~+)")
	notPathRE = regexp.MustCompile(`[\s<>{}*$=:?&#@,;()\[\]"'…]|\.\.\.`)
)

// check returns the problems of one Markdown file, each as
// "path:line: what".
func (c *checker) check(file string) []string {
	b, err := os.ReadFile(file)
	if err != nil {
		return []string{err.Error()}
	}
	rel := c.rel(file)
	text := string(b)
	var problems []string
	report := func(line int, format string, args ...any) {
		problems = append(problems, fmt.Sprintf("%s:%d: %s", rel, line, fmt.Sprintf(format, args...)))
	}
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		for _, w := range banned {
			if strings.Contains(l, w) {
				report(i+1, "mentions %q, a directory a clone of the repository does not have", w)
			}
		}
	}
	for _, para := range paragraphs(lines) {
		prose, spans := splitCode(para.text)
		for _, s := range spans {
			c.checkSpan(file, s, func(format string, args ...any) { report(para.line(s.off), format, args...) })
		}
		for _, m := range linkRE.FindAllStringSubmatchIndex(prose, -1) {
			target := prose[m[2]:m[3]]
			c.checkLink(file, target, func(format string, args ...any) { report(para.line(m[0]), format, args...) })
		}
		// What is left of the prose once links and reference
		// definitions are gone (same length, so offsets still hold).
		words := linkRE.ReplaceAllStringFunc(prose, func(s string) string { return strings.Repeat(" ", len(s)) })
		off := 0
		for _, pl := range strings.Split(prose, "\n") {
			if m := refDefRE.FindStringSubmatch(pl); m != nil {
				c.checkLink(file, m[1], func(format string, args ...any) { report(para.line(off), format, args...) })
				words = words[:off] + strings.Repeat(" ", len(pl)) + words[off+len(pl):]
			}
			off += len(pl) + 1
		}
		for _, m := range mdNameRE.FindAllStringSubmatchIndex(words, -1) {
			name := words[m[2]:m[3]]
			if !c.resolvesUpward(file, name) {
				report(para.line(m[2]), "%s does not exist here or in any directory above up to the repository root", name)
			}
		}
		for _, m := range urlRE.FindAllStringSubmatchIndex(words, -1) {
			if host := words[m[2]:m[3]]; isSite(host) {
				report(para.line(m[0]), "site address %q: the repository must explain itself; name a public source in plain text", words[m[0]:m[1]])
			}
		}
	}
	return problems
}

// checkSpan checks one backticked span (rules 3 and, for addresses, the
// site rule).
func (c *checker) checkSpan(file string, s span, report func(string, ...any)) {
	for _, m := range urlRE.FindAllStringSubmatch(s.text, -1) {
		if isSite(m[1]) {
			report("site address %q: the repository must explain itself; name a public source in plain text", m[0])
		}
	}
	p := s.text
	if notPathRE.MatchString(p) {
		return
	}
	first, _, hasSlash := strings.Cut(p, "/")
	isPath := strings.HasPrefix(p, "./") || strings.HasPrefix(p, "../") ||
		strings.HasSuffix(p, ".md") || (hasSlash && c.rootDirs[first])
	if !isPath {
		return
	}
	if !c.resolvesUpward(file, p) {
		report("`%s` does not exist here or in any directory above up to the repository root", s.text)
	}
}

// checkLink checks one link target (rules 1 and 2).
func (c *checker) checkLink(file, target string, report func(string, ...any)) {
	switch {
	case target == "":
		report("empty link")
		return
	case schemeRE.MatchString(target):
		report("link %q points outside the repository", target)
		return
	case strings.HasPrefix(target, "/"):
		report("link %q is absolute; write it relative to %s", target, c.rel(filepath.Dir(file)))
		return
	}
	path, anchor, _ := strings.Cut(target, "#")
	dest := file
	if path != "" {
		dest = filepath.Join(filepath.Dir(file), filepath.FromSlash(path))
		if !c.inside(dest) {
			report("link %q leaves the repository", target)
			return
		}
		if _, err := os.Stat(dest); err != nil {
			report("link %q: %s does not exist", target, c.rel(dest))
			return
		}
	}
	if anchor == "" {
		return
	}
	if !strings.HasSuffix(dest, ".md") {
		report("link %q has an anchor into a file that is not Markdown", target)
		return
	}
	if !slices.Contains(c.slugs(dest), anchor) {
		report("link %q: anchor %q names no heading of %s", target, "#"+anchor, c.rel(dest))
	}
}

// resolvesUpward reports whether p names an existing file or directory
// relative to file's directory or to any directory above it, up to and
// including the root, without leaving the root.
func (c *checker) resolvesUpward(file, p string) bool {
	p = filepath.FromSlash(strings.TrimSuffix(p, "/"))
	for dir := filepath.Dir(file); ; dir = filepath.Dir(dir) {
		cand := filepath.Join(dir, p)
		if c.inside(cand) {
			if _, err := os.Stat(cand); err == nil {
				return true
			}
		}
		if dir == c.root || !c.inside(dir) {
			return false
		}
	}
}

func (c *checker) inside(p string) bool {
	r, err := filepath.Rel(c.root, p)
	return err == nil && r != ".." && !strings.HasPrefix(r, ".."+string(filepath.Separator)) && !filepath.IsAbs(r)
}

func (c *checker) rel(p string) string {
	r, err := filepath.Rel(c.root, p)
	if err != nil {
		return p
	}
	return filepath.ToSlash(r)
}

// slugs returns the anchors GitHub gives the headings of a Markdown file:
// the heading's text lower-cased, with everything but letters, digits,
// spaces, hyphens and underscores dropped and spaces turned into hyphens;
// a repeated slug gets -1, -2, ... Headings inside fenced code blocks do
// not count.
func (c *checker) slugs(file string) []string {
	if s, ok := c.headings[file]; ok {
		return s
	}
	b, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	var out []string
	seen := map[string]int{}
	fence := ""
	for _, l := range strings.Split(string(b), "\n") {
		if f := fenceRE.FindStringSubmatch(l); f != nil {
			switch {
			case fence == "":
				fence = f[1][:3]
			case strings.HasPrefix(f[1], fence):
				fence = ""
			}
			continue
		}
		if fence != "" {
			continue
		}
		m := headingRE.FindStringSubmatch(l)
		if m == nil {
			continue
		}
		s := slug(m[1])
		if n := seen[s]; n > 0 {
			out = append(out, fmt.Sprintf("%s-%d", s, n))
		} else {
			out = append(out, s)
		}
		seen[s]++
	}
	c.headings[file] = out
	return out
}

func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case unicode.IsLetter(r) || unicode.IsDigit(r) || r == '-' || r == '_':
			b.WriteRune(r)
		case r == ' ':
			b.WriteRune('-')
		}
	}
	return b.String()
}

// isSite reports whether a URL's host is a site on the network rather than
// an address of the reader's own machine or cluster in an example: a DNS
// name with a dot in it. IP addresses, localhost and shell variables are
// examples.
func isSite(host string) bool {
	host = strings.TrimPrefix(host, "[")
	if h, _, ok := strings.Cut(host, "]"); ok {
		host = h
	} else if h, _, ok := strings.Cut(host, ":"); ok {
		host = h
	}
	if host == "" || strings.HasPrefix(host, "$") || !strings.Contains(host, ".") {
		return false
	}
	return strings.ContainsFunc(host, unicode.IsLetter)
}

// paragraph is a run of lines outside fenced code blocks, ended by a blank
// line or a fence.
type paragraph struct {
	first  int   // 1-based line number of its first line
	starts []int // byte offset in text of each line's start
	text   string
}

// line returns the 1-based line number of byte offset off in p.text.
func (p paragraph) line(off int) int {
	i, found := slices.BinarySearch(p.starts, off)
	if !found {
		i--
	}
	return p.first + i
}

func paragraphs(lines []string) []paragraph {
	var out []paragraph
	var cur *paragraph
	flush := func() {
		if cur != nil {
			out = append(out, *cur)
			cur = nil
		}
	}
	fence := ""
	for i, l := range lines {
		if f := fenceRE.FindStringSubmatch(l); f != nil {
			switch {
			case fence == "":
				flush()
				fence = f[1][:3]
			case strings.HasPrefix(f[1], fence):
				fence = ""
			}
			continue
		}
		if fence != "" {
			continue
		}
		if strings.TrimSpace(l) == "" {
			flush()
			continue
		}
		if cur == nil {
			cur = &paragraph{first: i + 1}
		} else {
			cur.text += "\n"
		}
		cur.starts = append(cur.starts, len(cur.text))
		cur.text += l
	}
	flush()
	return out
}

// span is one backticked code span: its content (a line break inside it
// read as a space, as Markdown renders it) and its offset in the
// paragraph.
type span struct {
	text string
	off  int
}

// splitCode returns text with every code span blanked out (same length,
// so offsets still hold) and the spans themselves. A run of n backticks
// opens a span that the next run of exactly n backticks closes; a run
// with no partner is literal text.
func splitCode(text string) (string, []span) {
	var spans []span
	out := []byte(text)
	i := 0
	for i < len(text) {
		if text[i] != '`' {
			i++
			continue
		}
		n := 0
		for i+n < len(text) && text[i+n] == '`' {
			n++
		}
		end := -1
		for j := i + n; j < len(text); {
			if text[j] != '`' {
				j++
				continue
			}
			m := 0
			for j+m < len(text) && text[j+m] == '`' {
				m++
			}
			if m == n {
				end = j
				break
			}
			j += m
		}
		if end < 0 {
			i += n
			continue
		}
		content := strings.TrimSpace(strings.ReplaceAll(text[i+n:end], "\n", " "))
		spans = append(spans, span{text: content, off: i})
		for k := i; k < end+n; k++ {
			if out[k] != '\n' {
				out[k] = ' '
			}
		}
		i = end + n
	}
	return string(out), spans
}
