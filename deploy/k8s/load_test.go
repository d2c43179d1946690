package k8s

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"
)

// kinds are the API types the manifests may hold, by "apiVersion/kind".
// Anything else is an error: a typo in either would otherwise pass.
var kinds = map[string]func() metav1.Object{
	"v1/Namespace":                  func() metav1.Object { return &corev1.Namespace{} },
	"v1/Service":                    func() metav1.Object { return &corev1.Service{} },
	"v1/Secret":                     func() metav1.Object { return &corev1.Secret{} },
	"v1/ConfigMap":                  func() metav1.Object { return &corev1.ConfigMap{} },
	"apps/v1/StatefulSet":           func() metav1.Object { return &appsv1.StatefulSet{} },
	"apps/v1/Deployment":            func() metav1.Object { return &appsv1.Deployment{} },
	"policy/v1/PodDisruptionBudget": func() metav1.Object { return &policyv1.PodDisruptionBudget{} },
	"batch/v1/Job":                  func() metav1.Object { return &batchv1.Job{} },
}

// object is one decoded document.
type object struct {
	file string // base name of the file it came from
	kind string // "apiVersion/kind"
	obj  metav1.Object
}

func (o object) String() string {
	return fmt.Sprintf("%s: %s %s", o.file, o.kind[strings.LastIndex(o.kind, "/")+1:], o.obj.GetName())
}

// kustomization is the part of kustomize's Kustomization these manifests
// use; decoding strictly into it refuses any other field.
type kustomization struct {
	APIVersion string   `json:"apiVersion"`
	Kind       string   `json:"kind"`
	Resources  []string `json:"resources"`
	Images     []struct {
		Name    string `json:"name"`
		NewName string `json:"newName"`
		NewTag  string `json:"newTag"`
	} `json:"images"`
}

// manifests is every object of the directory, plus the Secret
// make-secret.sh printed when it is added.
type manifests struct {
	objects []object
	kust    *kustomization
	files   []string // the .yaml files other than kustomization.yaml
}

// loadDir decodes every .yaml file in dir.
func loadDir(dir string) (*manifests, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	texts := map[string][]byte{}
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		texts[filepath.Base(p)] = b
	}
	return loadTexts(texts)
}

// loadTexts decodes files given by name; kustomization.yaml is the
// Kustomization, every other file holds API objects.
func loadTexts(texts map[string][]byte) (*manifests, error) {
	m := &manifests{}
	var errs []error
	names := make([]string, 0, len(texts))
	for name := range texts {
		names = append(names, name)
	}
	sort.Strings(names)
	for _, name := range names {
		if name == "kustomization.yaml" {
			k, err := decodeKustomization(texts[name])
			if err != nil {
				errs = append(errs, fmt.Errorf("%s: %w", name, err))
			}
			m.kust = k
			continue
		}
		m.files = append(m.files, name)
		objs, err := decodeObjects(name, texts[name])
		errs = append(errs, err)
		m.objects = append(m.objects, objs...)
	}
	return m, errors.Join(errs...)
}

func decodeKustomization(text []byte) (*kustomization, error) {
	var k kustomization
	if err := yaml.UnmarshalStrict(text, &k); err != nil {
		return nil, err
	}
	if k.APIVersion != "kustomize.config.k8s.io/v1beta1" || k.Kind != "Kustomization" {
		return nil, fmt.Errorf("apiVersion/kind %s/%s, want kustomize.config.k8s.io/v1beta1/Kustomization", k.APIVersion, k.Kind)
	}
	return &k, nil
}

// decodeObjects decodes every document of one file strictly into the type
// its apiVersion and kind name.
func decodeObjects(file string, text []byte) ([]object, error) {
	r := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(text)))
	var out []object
	var errs []error
	for n := 1; ; n++ {
		doc, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return out, fmt.Errorf("%s: document %d: %w", file, n, err)
		}
		if onlyComments(doc) {
			continue
		}
		o, err := decodeObject(file, doc)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: document %d: %w", file, n, err))
			continue
		}
		out = append(out, o)
	}
	return out, errors.Join(errs...)
}

func decodeObject(file string, doc []byte) (object, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return object{}, err
	}
	kind := tm.APIVersion + "/" + tm.Kind
	newObj, ok := kinds[kind]
	if !ok {
		known := make([]string, 0, len(kinds))
		for k := range kinds {
			known = append(known, k)
		}
		sort.Strings(known)
		return object{}, fmt.Errorf("unknown kind %q: the manifests may hold %s", kind, strings.Join(known, ", "))
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return object{}, fmt.Errorf("%s: %w", kind, err)
	}
	if obj.GetName() == "" {
		return object{}, fmt.Errorf("%s has no metadata.name", kind)
	}
	return object{file: file, kind: kind, obj: obj}, nil
}

func onlyComments(doc []byte) bool {
	for _, line := range strings.Split(string(doc), "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") && l != "---" {
			return false
		}
	}
	return true
}

// find returns the object of kind (as in kinds) and name, or nil.
func (m *manifests) find(kind, name string) metav1.Object {
	for _, o := range m.objects {
		if o.kind == kind && o.obj.GetName() == name {
			return o.obj
		}
	}
	return nil
}

func (m *manifests) secret(name string) *corev1.Secret {
	s, _ := m.find("v1/Secret", name).(*corev1.Secret)
	return s
}

func (m *manifests) configMap(name string) *corev1.ConfigMap {
	c, _ := m.find("v1/ConfigMap", name).(*corev1.ConfigMap)
	return c
}

func (m *manifests) service(name string) *corev1.Service {
	s, _ := m.find("v1/Service", name).(*corev1.Service)
	return s
}

func (m *manifests) statefulSet(name string) *appsv1.StatefulSet {
	s, _ := m.find("apps/v1/StatefulSet", name).(*appsv1.StatefulSet)
	return s
}

func (m *manifests) deployment(name string) *appsv1.Deployment {
	d, _ := m.find("apps/v1/Deployment", name).(*appsv1.Deployment)
	return d
}

func (m *manifests) job(name string) *batchv1.Job {
	j, _ := m.find("batch/v1/Job", name).(*batchv1.Job)
	return j
}

func (m *manifests) pdb(name string) *policyv1.PodDisruptionBudget {
	p, _ := m.find("policy/v1/PodDisruptionBudget", name).(*policyv1.PodDisruptionBudget)
	return p
}

// workload is a pod template and what runs it.
type workload struct {
	object
	labels   map[string]string // the template's
	selector *metav1.LabelSelector
	spec     *corev1.PodSpec
	sts      *appsv1.StatefulSet // set for a StatefulSet
}

func (m *manifests) workloads() []workload {
	var out []workload
	for _, o := range m.objects {
		switch v := o.obj.(type) {
		case *appsv1.StatefulSet:
			out = append(out, workload{o, v.Spec.Template.Labels, v.Spec.Selector, &v.Spec.Template.Spec, v})
		case *appsv1.Deployment:
			out = append(out, workload{o, v.Spec.Template.Labels, v.Spec.Selector, &v.Spec.Template.Spec, nil})
		case *batchv1.Job:
			out = append(out, workload{object: o, labels: v.Spec.Template.Labels, selector: v.Spec.Selector, spec: &v.Spec.Template.Spec})
		}
	}
	return out
}

// allContainers is a pod's init containers, then its containers.
func allContainers(spec *corev1.PodSpec) []*corev1.Container {
	var out []*corev1.Container
	for i := range spec.InitContainers {
		out = append(out, &spec.InitContainers[i])
	}
	for i := range spec.Containers {
		out = append(out, &spec.Containers[i])
	}
	return out
}
