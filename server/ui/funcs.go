package ui

import (
	"html/template"
	"strings"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

func funcs() template.FuncMap {
	return template.FuncMap{
		"status": statusName,
		"behavior": func(b lodestonepb.SessionBehavior) string {
			if b == lodestonepb.SessionBehavior_SESSION_DELETE {
				return "delete"
			}
			return "release"
		},
	}
}

// statusName is a check state as Consul writes it, also its CSS class.
func statusName(s lodestonepb.HealthStatus) string {
	switch s {
	case lodestonepb.HealthStatus_HEALTH_PASSING:
		return "passing"
	case lodestonepb.HealthStatus_HEALTH_WARNING:
		return "warning"
	case lodestonepb.HealthStatus_HEALTH_CRITICAL:
		return "critical"
	}
	return strings.ToLower(strings.TrimPrefix(s.String(), "HEALTH_"))
}
