package lodestonepb

import (
	"fmt"
	"strings"
)

// Hand-written helpers beside the generated code: the words Consul's APIs
// use for a HealthStatus, shared by the HTTP API, the CLI and agents so
// they spell them one way.

// HealthStatusWord is Consul's word for s: "passing", "warning" or
// "critical"; "" for HEALTH_STATUS_UNSPECIFIED or an unknown value.
func HealthStatusWord(s HealthStatus) string {
	switch s {
	case HealthStatus_HEALTH_PASSING:
		return "passing"
	case HealthStatus_HEALTH_WARNING:
		return "warning"
	case HealthStatus_HEALTH_CRITICAL:
		return "critical"
	}
	return ""
}

// ParseHealthStatus reads Consul's status words, case-insensitively; ""
// is HEALTH_STATUS_UNSPECIFIED.
func ParseHealthStatus(s string) (HealthStatus, error) {
	switch strings.ToLower(s) {
	case "":
		return HealthStatus_HEALTH_STATUS_UNSPECIFIED, nil
	case "passing":
		return HealthStatus_HEALTH_PASSING, nil
	case "warning":
		return HealthStatus_HEALTH_WARNING, nil
	case "critical":
		return HealthStatus_HEALTH_CRITICAL, nil
	}
	return 0, fmt.Errorf("status %q: use passing, warning or critical", s)
}
