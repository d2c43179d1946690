package buildinfo

import (
	"runtime"
	"runtime/debug"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

func TestResolveOrder(t *testing.T) {
	t.Parallel()
	vcs := &debug.BuildInfo{Main: debug.Module{Version: "v1.4.0"}, Settings: []debug.BuildSetting{
		{Key: "vcs.revision", Value: "1111111111111111111111111111111111111111"},
		{Key: "vcs.time", Value: "2026-01-02T03:04:05Z"},
	}}
	devel := &debug.BuildInfo{Main: debug.Module{Version: "(devel)"}}
	for _, tc := range []struct {
		name                string
		ldV, ldC, ldD       string
		bi                  *debug.BuildInfo
		wantV, wantC, wantD string
	}{
		{"ldflags win over the toolchain's record", "v2.0.0", "abc", "2026-11-28T04:10:58Z", vcs,
			"v2.0.0", "abc", "2026-11-28T04:10:58Z"},
		{"the toolchain's record fills what ldflags left out", "v2.0.0", "", "", vcs,
			"v2.0.0", "1111111111111111111111111111111111111111", "2026-01-02T03:04:05Z"},
		{"go install ...@version", "", "", "", vcs,
			"v1.4.0", "1111111111111111111111111111111111111111", "2026-01-02T03:04:05Z"},
		{"(devel) says nothing", "", "", "", devel, UnknownVersion, Unknown, Unknown},
		{"no record at all", "", "", "", nil, UnknownVersion, Unknown, Unknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := resolve(tc.ldV, tc.ldC, tc.ldD, tc.bi)
			if got.Version != tc.wantV || got.Commit != tc.wantC || got.Date != tc.wantD {
				t.Errorf("got %q %q %q, want %q %q %q", got.Version, got.Commit, got.Date, tc.wantV, tc.wantC, tc.wantD)
			}
			if got.GoVersion != runtime.Version() || got.OS != runtime.GOOS || got.Arch != runtime.GOARCH {
				t.Errorf("toolchain %s %s/%s, want %s %s/%s", got.GoVersion, got.OS, got.Arch, runtime.Version(), runtime.GOOS, runtime.GOARCH)
			}
		})
	}
}

func TestStringNamesEveryField(t *testing.T) {
	t.Parallel()
	i := Info{Version: "v1.2.0", Commit: "abc", Date: "2026-11-28T04:10:58Z", GoVersion: "go1.26.8", OS: "linux", Arch: "arm64"}
	const want = "v1.2.0 (commit abc, built 2026-11-28T04:10:58Z, go1.26.8 linux/arm64)"
	if got := i.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
}

func TestCollectorExportsTheBuild(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	reg.MustRegister(NewCollector())
	i := Get()
	want := `# HELP lodestone_build_info Always 1; its labels say which build of Lodestone this process runs.
# TYPE lodestone_build_info gauge
lodestone_build_info{commit="` + i.Commit + `",goversion="` + runtime.Version() + `",version="` + i.Version + `"} 1
`
	if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "lodestone_build_info"); err != nil {
		t.Error(err)
	}
}
