// Package docs holds the project's prose: the architecture
// (architecture.md) and one runbook per failure mode (runbooks/). It has
// no code; its test keeps every Markdown file of the repository pointing
// inside the repository, so that a fresh clone's documents reference
// nothing it lacks.
//
// # What the test checks
//
// TestMarkdownReferences reads every *.md file under the repository root
// (bench/ included: it is a Go module of its own but part of the
// repository; directories whose names start with a dot, such as .git, are
// skipped). Fenced code blocks are commands and sample output, not
// references, and only rule 6 reads them. Elsewhere:
//
//  1. Every Markdown link, [text](target), ![alt](target) or a reference
//     definition "[label]: target", must be relative: a target with a
//     scheme (http:, https:, mailto:, ...) or starting with "/" fails.
//     There is no allowlist of sites: the repository explains itself, and
//     a public source is named in plain text (for example "Roblox's public
//     post-mortem of its October 2021 outage").
//  2. A relative link resolves against the linking file's directory, must
//     stay inside the repository root and must name an existing file or
//     directory. Its "#anchor", if any, must be the GitHub-style slug of a
//     heading of the target Markdown file (or of the linking file, for a
//     bare "#anchor").
//  3. A backticked span that looks like a repository path must exist. It
//     looks like one when it holds no spaces, placeholders or punctuation
//     of code and flags (<>{}*$=:?&#@,;()[]"' or "..."), and either
//     starts with "./" or "../", or ends in ".md", or has a "/" after a
//     first segment that names an entry at the repository root (`server/`,
//     `raftlog/FORMAT.md`, `docs/runbooks`). It resolves against the
//     file's directory or any directory above it up to the root, so
//     bench/README.md may say `cmd/kvbench` for bench/cmd/kvbench. A span
//     whose first segment is no root entry (a KV key such as
//     `_lodestone/admission`, a URL path such as `/v1/kv/`) is not a path.
//  4. A Markdown file name in prose (a word ending in ".md") must resolve
//     the same way: "DESIGN.md" in a sentence fails, since the repository
//     has no such file.
//  5. A URL whose host is a DNS name with a dot (a site) fails, in prose or
//     in backticks. Addresses of the reader's own machine or cluster in
//     examples (an IP address, localhost, a $VARIABLE) pass.
//  6. Nowhere, code blocks included, may a file say "../shared",
//     "shared/DESIGN" or "seeds/": those name a directory beside the
//     repository, and the source texts once kept in it, that a clone does
//     not have.
//
// Packages and files that do not exist yet (a planned package, say) are
// therefore written as plain names in prose ("the raftnode package"),
// never as links or backticked paths: a backticked path is a promise that
// the file is there, and the test holds the documents to it when files
// move.
//
// TestArchitectureIsLinked checks that the README links the architecture
// and the benchmark results, and TestChecker runs each rule on small
// files written for it.
package docs
