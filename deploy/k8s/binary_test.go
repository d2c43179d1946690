package k8s

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/lodestone-kv/lodestone/deploy/internal/binary"
	corev1 "k8s.io/api/core/v1"
)

func TestMain(m *testing.M) { os.Exit(binary.Main(m)) }

// lodestoneBinary is the binary built from the main module, once.
func lodestoneBinary(t *testing.T) string { return binary.Lodestone(t) }

// helpCache holds `lodestone <path> --help`, by path.
var helpCache sync.Map

func helpOf(t *testing.T, bin string, path []string) string {
	t.Helper()
	key := strings.Join(path, " ")
	if h, ok := helpCache.Load(key); ok {
		return h.(string)
	}
	out, err := runBinary(bin, append(slices.Clone(path), "--help"))
	if err != nil {
		t.Fatalf("lodestone %s --help: %v", key, err)
	}
	helpCache.Store(key, out)
	return out
}

// runBinary runs bin with args, no environment but PATH, and returns its
// stdout, or an error with its stderr.
func runBinary(bin string, args []string) (string, error) {
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%v: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// envName matches the environment variables a lodestone command reads.
var envName = regexp.MustCompile(`^(LODESTONE|CONSUL)_[A-Z_]+$`)

// checkWithBinary parses every lodestone container's command line with
// the binary itself: its args (env references filled in) followed by
// --help, which cobra parses in full, refusing unknown flags and bad
// values, before it prints the help. It also checks the command path
// exists and that every LODESTONE_ variable the container sets is one the
// command reads.
func checkWithBinary(t *testing.T, bin string, m *manifests) problems {
	t.Helper()
	var p problems
	for _, w := range m.workloads() {
		for _, c := range allContainers(w.spec) {
			cl, ok := parseCmdline(c)
			if !ok {
				continue // checkManifests reports it
			}
			where := fmt.Sprintf("%s container %s", w, c.Name)
			help := helpOf(t, bin, cl.path)
			if !strings.Contains(help, "Usage:\n  lodestone "+cl.command()) {
				p.addf("%s: lodestone %s is not a command of the binary", where, cl.command())
				continue
			}
			args := argsForBinary(t, m, w, c, cl, help)
			if _, err := runBinary(bin, append(args, "--help")); err != nil {
				p.addf("%s: lodestone refuses the command line: %v", where, err)
			}
			for _, e := range c.Env {
				if envName.MatchString(e.Name) && !strings.Contains(help, e.Name) {
					p.addf("%s: env %s is not one lodestone %s reads", where, e.Name, cl.command())
				}
			}
		}
	}
	return p
}

// argsForBinary is c's args with env references filled in as the kubelet
// would.
func argsForBinary(t *testing.T, m *manifests, w workload, c *corev1.Container, cl *cmdline, help string) []string {
	t.Helper()
	vars := envValues(m, c, map[string]string{"metadata.name": w.obj.GetName() + "-0", "status.podIP": "10.0.0.7"})
	var out []string
	for _, a := range c.Args {
		a, _ = expand(a, vars)
		out = append(out, a)
	}
	return out
}
