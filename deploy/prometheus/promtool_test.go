package prometheus

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// repoRoot is the repository's root, where runbook_url paths start.
const repoRoot = "../.."

// promtool returns promtool's path, or skips the test: CI installs it
// (.ci/run), a developer may not have it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Skip("promtool not found: install Debian's prometheus package (apt-get install prometheus); CI does")
	}
	return p
}

func runPromtool(t *testing.T, dir string, args ...string) {
	t.Helper()
	cmd := exec.Command(promtool(t), args...)
	cmd.Dir = dir
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

func TestRulesPassPromtoolCheck(t *testing.T) {
	runPromtool(t, ".", "check", "rules", "recording.yml", "alerts.yml")
}

func TestAlertUnitTests(t *testing.T) {
	files, err := filepath.Glob("tests/*.yml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no unit tests in tests/ (%v)", err)
	}
	runPromtool(t, ".", append([]string{"test", "rules"}, files...)...)
}

// TestEveryAlertFiresAndStaysSilent: the unit tests have, for every alert,
// a case where it fires and one where it is expected silent.
func TestEveryAlertFiresAndStaysSilent(t *testing.T) {
	alerts := readRules(t, "alerts.yml")
	fires, silent := map[string]bool{}, map[string]bool{}
	files, _ := filepath.Glob("tests/*.yml")
	for _, f := range files {
		var ut unitTestFile
		readYAML(t, f, &ut)
		if !slices.Contains(ut.RuleFiles, "../alerts.yml") || !slices.Contains(ut.RuleFiles, "../recording.yml") {
			t.Errorf("%s: rule_files %v, want ../recording.yml and ../alerts.yml", f, ut.RuleFiles)
		}
		for _, c := range ut.Tests {
			for _, a := range c.AlertRuleTest {
				if len(a.ExpAlerts) > 0 {
					fires[a.AlertName] = true
				} else {
					silent[a.AlertName] = true
				}
			}
		}
	}
	for _, r := range alerts {
		if !fires[r.Alert] {
			t.Errorf("no unit test fires %s", r.Alert)
		}
		if !silent[r.Alert] {
			t.Errorf("no unit test keeps %s silent", r.Alert)
		}
	}
}

// TestEveryAlertNamesItsRunbook: severity, summary, description, and a
// runbook_url that is a runbook in this repository.
func TestEveryAlertNamesItsRunbook(t *testing.T) {
	if errs := checkAlerts(readRules(t, "alerts.yml"), repoRoot); len(errs) > 0 {
		t.Error(strings.Join(errs, "\n"))
	}
}

// TestAlertCheckCatchesMistakes: the check above fails on what it must.
func TestAlertCheckCatchesMistakes(t *testing.T) {
	good := rule{Alert: "A", Expr: "up == 0", Labels: map[string]string{"severity": "warning"},
		Annotations: map[string]string{"summary": "s", "description": "d", "runbook_url": "docs/runbooks/quorum-loss.md"}}
	for name, change := range map[string]func(r *rule){
		"no severity":      func(r *rule) { delete(r.Labels, "severity") },
		"unknown severity": func(r *rule) { r.Labels["severity"] = "page" },
		"no summary":       func(r *rule) { delete(r.Annotations, "summary") },
		"runbook missing":  func(r *rule) { r.Annotations["runbook_url"] = "docs/runbooks/no-such.md" },
		"outside link":     func(r *rule) { r.Annotations["runbook_url"] = "https://example.com/runbook.md" },
		"not a runbook":    func(r *rule) { r.Annotations["runbook_url"] = "README.md" },
	} {
		r := good
		r.Labels, r.Annotations = clone(good.Labels), clone(good.Annotations)
		change(&r)
		if errs := checkAlerts([]rule{r}, repoRoot); len(errs) == 0 {
			t.Errorf("%s: accepted", name)
		}
	}
	if errs := checkAlerts([]rule{good}, repoRoot); len(errs) > 0 {
		t.Errorf("a good alert refused: %v", errs)
	}
}

func clone(m map[string]string) map[string]string {
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

func checkAlerts(alerts []rule, root string) []string {
	var errs []string
	for _, r := range alerts {
		if s := r.Labels["severity"]; s != "critical" && s != "warning" {
			errs = append(errs, fmt.Sprintf("%s: severity %q, want critical or warning", r.Alert, s))
		}
		for _, a := range []string{"summary", "description", "runbook_url"} {
			if r.Annotations[a] == "" {
				errs = append(errs, fmt.Sprintf("%s: no %s annotation", r.Alert, a))
			}
		}
		u := r.Annotations["runbook_url"]
		if u == "" {
			continue
		}
		if !strings.HasPrefix(u, "docs/runbooks/") || !strings.HasSuffix(u, ".md") {
			errs = append(errs, fmt.Sprintf("%s: runbook_url %q is not a path under docs/runbooks/", r.Alert, u))
			continue
		}
		if _, err := os.Stat(filepath.Join(root, u)); err != nil {
			errs = append(errs, fmt.Sprintf("%s: runbook_url %q: %v", r.Alert, u, err))
		}
	}
	return errs
}

// TestExampleConfigPassesPromtool checks prometheus.yml with its rule
// files, in a copy whose TLS files exist (promtool checks they do).
func TestExampleConfigPassesPromtool(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"prometheus.yml", "recording.yml", "alerts.yml"} {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var cfg exampleConfig
	readYAML(t, "prometheus.yml", &cfg)
	jobs := map[string]bool{}
	for _, sc := range cfg.ScrapeConfigs {
		jobs[sc.JobName] = true
		for _, f := range []string{sc.TLSConfig.CAFile, sc.TLSConfig.CertFile, sc.TLSConfig.KeyFile} {
			if f == "" {
				continue
			}
			if filepath.IsAbs(f) {
				t.Errorf("job %s: %s is absolute; the example keeps its files beside it", sc.JobName, f)
				continue
			}
			p := filepath.Join(dir, f)
			if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(p, nil, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The rules select servers by this job.
	for _, j := range []string{"lodestone", "lodestone-agent", "lodestone-gateway"} {
		if !jobs[j] {
			t.Errorf("prometheus.yml has no job %q", j)
		}
	}
	runPromtool(t, dir, "check", "config", "prometheus.yml")
}

type rule struct {
	Record      string            `json:"record"`
	Alert       string            `json:"alert"`
	Expr        string            `json:"expr"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []rule `json:"rules"`
	} `json:"groups"`
}

type unitTestFile struct {
	RuleFiles []string `json:"rule_files"`
	Tests     []struct {
		AlertRuleTest []struct {
			AlertName string `json:"alertname"`
			ExpAlerts []any  `json:"exp_alerts"`
		} `json:"alert_rule_test"`
	} `json:"tests"`
}

type exampleConfig struct {
	ScrapeConfigs []struct {
		JobName   string `json:"job_name"`
		TLSConfig struct {
			CAFile   string `json:"ca_file"`
			CertFile string `json:"cert_file"`
			KeyFile  string `json:"key_file"`
		} `json:"tls_config"`
	} `json:"scrape_configs"`
}

func readRules(t *testing.T, path string) []rule {
	t.Helper()
	var f ruleFile
	readYAML(t, path, &f)
	var out []rule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	if len(out) == 0 {
		t.Fatalf("%s has no rules", path)
	}
	return out
}

func readYAML(t *testing.T, path string, v any) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
}
