// Package runbooks reads the operator runbooks in docs/runbooks/ for the
// tests that run every command in them (runbooks_test.go here, and
// tools/compact for raft-log-bloat.md).
//
// A runbook marks each block of commands "```sh PHASE": the phase says what
// must be running (or stopped) when the block runs; the test decides what a
// phase means. A command line ending in "# exits N" must exit N, any other
// 0. Sample outputs are "```text" blocks; metric names quoted as inline
// code outside blocks are checked against the processes' /metrics.
package runbooks

import (
	"regexp"
	"strconv"
	"strings"
)

// Block is one ```sh block: its phase and its command lines (blank lines
// and comment lines dropped).
type Block struct {
	Phase string
	Lines []string
}

// Parse returns md's sh blocks, its text blocks (one slice of lines each)
// and the first submatch of every match of metric in the lines outside
// blocks.
func Parse(md string, metric *regexp.Regexp) (blocks []Block, texts [][]string, metrics []string) {
	var cur *Block
	var text []string
	inText := false
	for _, line := range strings.Split(md, "\n") {
		switch {
		case cur != nil && line == "```":
			blocks = append(blocks, *cur)
			cur = nil
		case inText && line == "```":
			texts = append(texts, text)
			text, inText = nil, false
		case cur != nil:
			if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
				cur.Lines = append(cur.Lines, l)
			}
		case inText:
			text = append(text, line)
		case strings.HasPrefix(line, "```sh"):
			cur = &Block{Phase: strings.TrimSpace(strings.TrimPrefix(line, "```sh"))}
		case line == "```text":
			inText = true
		default:
			for _, m := range metric.FindAllStringSubmatch(line, -1) {
				metrics = append(metrics, m[1])
			}
		}
	}
	return blocks, texts, metrics
}

var exitsRE = regexp.MustCompile(`#\s*exits (\d+)`)

// ExpectedExit reads "# exits N" at the end of a command line; 0 otherwise.
func ExpectedExit(line string) int {
	m := exitsRE.FindStringSubmatch(line)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}
