// Package buildinfo says which build of Lodestone is running: the version,
// commit and build date stamped in by the Makefile's -ldflags, and the Go
// version, OS and architecture the binary was built for.
//
// # Contract
//
// Get is the one source of these facts: `lodestone version`, `--version`,
// the Status RPC, the Consul API's /v1/agent/self and the
// lodestone_build_info metric all read it, so they never disagree.
//
// Each of Version, Commit and Date comes from the first of:
//
//  1. the -ldflags value (make build, make release):
//     -X <this package>.version=... .commit=... .date=...;
//  2. the Go toolchain's own record (runtime/debug.ReadBuildInfo): the
//     main module's version (go install ...@v1.2.3) and the vcs.revision
//     and vcs.time settings (a build with -buildvcs);
//  3. "dev" for the version, "unknown" for the commit and the date.
//
// A field is never empty. Get is cheap after its first call and safe for
// concurrent use.
package buildinfo

import (
	"cmp"
	"fmt"
	"runtime"
	"runtime/debug"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
)

// Set at build time: go build -ldflags "-X <this package>.version=..."
// (the Makefile's LDFLAGS). A plain go build leaves them empty.
var (
	version string
	commit  string
	date    string
)

// What a field says when nothing recorded it.
const (
	UnknownVersion = "dev"
	Unknown        = "unknown"
)

// Info describes one build. The JSON names are what `lodestone version -o
// json` prints.
type Info struct {
	Version   string `json:"version"`    // e.g. v1.2.0, v1.2.0-3-gabc1234-dirty, dev
	Commit    string `json:"commit"`     // the full revision, or unknown
	Date      string `json:"build_date"` // RFC 3339, the commit's time; or unknown
	GoVersion string `json:"go_version"` // e.g. go1.26.8
	OS        string `json:"os"`         // GOOS
	Arch      string `json:"arch"`       // GOARCH
}

// String is the one-line form: "v1.2.0 (commit abc..., built <date>,
// go1.26.8 linux/amd64)".
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, built %s, %s %s/%s)", i.Version, i.Commit, i.Date, i.GoVersion, i.OS, i.Arch)
}

var get = sync.OnceValue(func() Info {
	bi, _ := debug.ReadBuildInfo()
	return resolve(version, commit, date, bi)
})

// Get returns this binary's build.
func Get() Info { return get() }

// resolve applies the package contract's order to the ldflags values and
// the toolchain's record bi (nil when the binary has none).
func resolve(ldVersion, ldCommit, ldDate string, bi *debug.BuildInfo) Info {
	i := Info{Version: ldVersion, Commit: ldCommit, Date: ldDate,
		GoVersion: runtime.Version(), OS: runtime.GOOS, Arch: runtime.GOARCH}
	if bi != nil {
		// NB: "(devel)" is what a build inside the module's own tree
		// records without VCS stamping: it says nothing.
		if i.Version == "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		for _, s := range bi.Settings {
			switch {
			case s.Key == "vcs.revision" && i.Commit == "":
				i.Commit = s.Value
			case s.Key == "vcs.time" && i.Date == "":
				i.Date = s.Value
			}
		}
	}
	i.Version = cmp.Or(i.Version, UnknownVersion)
	i.Commit = cmp.Or(i.Commit, Unknown)
	i.Date = cmp.Or(i.Date, Unknown)
	return i
}

// NewCollector returns lodestone_build_info{version,commit,goversion} 1,
// the info metric every process (server, agent, gateway) registers on its
// own registry, so a dashboard can tell which build each one runs.
func NewCollector() prometheus.Collector {
	i := Get()
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "lodestone_build_info",
		Help: "Always 1; its labels say which build of Lodestone this process runs.",
		ConstLabels: prometheus.Labels{
			"version": i.Version, "commit": i.Commit, "goversion": i.GoVersion,
		},
	}, func() float64 { return 1 })
}
