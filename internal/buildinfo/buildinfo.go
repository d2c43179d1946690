// Package buildinfo says which build of Lodestone is running: the version,
// commit and build date stamped in by the Makefile's -ldflags, and the Go
// version the binary was built with.
package buildinfo

// Set at build time: go build -ldflags "-X <this package>.version=..."
// (the Makefile's LDFLAGS). A plain go build leaves them empty.
var (
	version string
	commit  string
	date    string
)
