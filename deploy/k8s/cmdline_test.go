package k8s

import (
	"regexp"
	"strings"

	corev1 "k8s.io/api/core/v1"
)

// cmdline is a lodestone container's command line, split the way the
// manifests write it: subcommand words, then --flag=value (or a bare
// boolean --flag) and positional arguments.
type cmdline struct {
	path       []string            // ["server"], ["acl", "bootstrap"]
	flags      map[string][]string // every value given, in order
	positional []string
}

var subcommandWord = regexp.MustCompile(`^[a-z][a-z-]*$`)

// parseCmdline splits c's command line; ok is false unless c runs
// lodestone.
func parseCmdline(c *corev1.Container) (cl *cmdline, ok bool) {
	if len(c.Command) != 1 || c.Command[0] != "lodestone" {
		return nil, false
	}
	cl = &cmdline{flags: map[string][]string{}}
	inPath := true
	for _, a := range c.Args {
		if inPath && subcommandWord.MatchString(a) {
			cl.path = append(cl.path, a)
			continue
		}
		inPath = false
		if name, ok := strings.CutPrefix(a, "--"); ok {
			name, value, hasValue := strings.Cut(name, "=")
			if !hasValue {
				value = "true"
			}
			cl.flags[name] = append(cl.flags[name], value)
			continue
		}
		cl.positional = append(cl.positional, a)
	}
	return cl, true
}

func (cl *cmdline) command() string { return strings.Join(cl.path, " ") }

// flag is the flag's effective value (pflag keeps the last), "" if absent.
func (cl *cmdline) flag(name string) string {
	v := cl.flags[name]
	if len(v) == 0 {
		return ""
	}
	return v[len(v)-1]
}

func (cl *cmdline) has(name string) bool { return len(cl.flags[name]) > 0 }

// varRef matches Kubernetes' $(VAR) references in args and env values.
var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// expand replaces $(VAR) as the kubelet does, by vars; missing lists the
// references it could not resolve (the kubelet leaves them verbatim).
func expand(s string, vars map[string]string) (out string, missing []string) {
	out = varRef.ReplaceAllStringFunc(s, func(ref string) string {
		name := ref[2 : len(ref)-1]
		if v, ok := vars[name]; ok {
			return v
		}
		missing = append(missing, name)
		return ref
	})
	return out, missing
}

// envValues gives each env var of c a value: literal values as they are,
// field references from fields ("metadata.name" → the pod's name), Secret
// and ConfigMap keys from m (empty if m lacks them).
func envValues(m *manifests, c *corev1.Container, fields map[string]string) map[string]string {
	out := map[string]string{}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			out[e.Name], _ = expand(e.Value, out)
		case e.ValueFrom.FieldRef != nil:
			out[e.Name] = fields[e.ValueFrom.FieldRef.FieldPath]
		case e.ValueFrom.SecretKeyRef != nil:
			if s := m.secret(e.ValueFrom.SecretKeyRef.Name); s != nil {
				out[e.Name] = secretValue(s, e.ValueFrom.SecretKeyRef.Key)
			}
		case e.ValueFrom.ConfigMapKeyRef != nil:
			if cm := m.configMap(e.ValueFrom.ConfigMapKeyRef.Name); cm != nil {
				out[e.Name] = cm.Data[e.ValueFrom.ConfigMapKeyRef.Key]
			}
		}
	}
	return out
}

// secretValue reads a key from data or stringData.
func secretValue(s *corev1.Secret, key string) string {
	if v, ok := s.Data[key]; ok {
		return string(v)
	}
	return s.StringData[key]
}

func secretHas(s *corev1.Secret, key string) bool {
	_, inData := s.Data[key]
	_, inString := s.StringData[key]
	return inData || inString
}
