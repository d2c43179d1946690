package k8s

import (
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	"sigs.k8s.io/yaml"
)

func TestPlaceholder(t *testing.T) {
	var s appsv1.StatefulSet
	_ = yaml.UnmarshalStrict([]byte("{}"), &s)
}
