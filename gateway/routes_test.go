package gateway

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func TestParseRoutes(t *testing.T) {
	for _, tc := range []struct {
		name, in, wantErr string
	}{
		{"ok", `{"routes": [{"name": "web", "service": "web"}, {"name": "api", "host": "API.example.com", "path_prefix": "/v1/", "service": "api", "strip_prefix": true}]}`, ""},
		{"unknown field", `{"routes": [{"name": "web", "service": "web", "prefix": "/"}]}`, "unknown field"},
		{"duplicate", `{"routes": [{"name": "a", "service": "x"}, {"name": "a", "service": "y"}]}`, "duplicate name"},
		{"no service", `{"routes": [{"name": "a"}]}`, "empty service"},
		{"relative prefix", `{"routes": [{"name": "a", "service": "x", "path_prefix": "v1"}]}`, "must start with '/'"},
		{"host with port", `{"routes": [{"name": "a", "service": "x", "host": "a.com:80"}]}`, "port"},
		{"bad wildcard", `{"routes": [{"name": "a", "service": "x", "host": "a.*.com"}]}`, "wildcard"},
		{"not json", `routes: []`, "parse routes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rs, err := ParseRoutes([]byte(tc.in))
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("ParseRoutes: %v", err)
				}
				if got, want := rs[1].Host, "api.example.com"; got != want {
					t.Errorf("host = %q, want lowercased %q", got, want)
				}
				if got, want := rs[0].PathPrefix, "/"; got != want {
					t.Errorf("default prefix = %q, want %q", got, want)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ParseRoutes error = %v, want one containing %q", err, tc.wantErr)
			}
			var re *RouteError
			if strings.Contains(tc.name, "json") || tc.name == "unknown field" {
				return
			}
			if !errors.As(err, &re) {
				t.Errorf("error %v is not a *RouteError", err)
			}
		})
	}
}

func TestPathPrefixAndStrip(t *testing.T) {
	for _, tc := range []struct {
		path, prefix string
		match        bool
		stripped     string
	}{
		{"/api", "/api", true, "/"},
		{"/api/", "/api", true, "/"},
		{"/api/users", "/api", true, "/users"},
		{"/apix", "/api", false, ""},
		{"/api/users", "/api/", true, "/users"},
		{"/api", "/api/", false, ""},
		{"/anything", "/", true, "/anything"},
	} {
		if got := pathHasPrefix(tc.path, tc.prefix); got != tc.match {
			t.Errorf("pathHasPrefix(%q, %q) = %v, want %v", tc.path, tc.prefix, got, tc.match)
		}
		if tc.match {
			if got := stripPrefix(tc.path, tc.prefix); got != tc.stripped {
				t.Errorf("stripPrefix(%q, %q) = %q, want %q", tc.path, tc.prefix, got, tc.stripped)
			}
		}
	}
	for in, want := range map[string]string{"a.com": "a.com", "a.com:80": "a.com", "[::1]:80": "::1", "[::1]": "::1"} {
		if got := hostOnly(in); got != want {
			t.Errorf("hostOnly(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		name  string
		edit  func(*Config)
		field string
	}{
		{"defaults", func(*Config) {}, ""},
		{"zero config", func(c *Config) { *c = Config{} }, ""},
		{"shards not a power of two", func(c *Config) { c.Shards = 12 }, "Shards"},
		{"replication above shards", func(c *Config) { c.Shards, c.Replication = 4, 8 }, "Replication"},
		{"same admin and proxy port", func(c *Config) { c.AdminListen = c.Listen }, "AdminListen"},
		{"bad listen", func(c *Config) { c.Listen = "8080" }, "Listen"},
		{"negative timeout", func(c *Config) { c.ConnectTimeout = -1 }, "ConnectTimeout"},
		{"budget ratio", func(c *Config) { c.RetryBudgetRatio = 2 }, "RetryBudgetRatio"},
		{"base above max ejection", func(c *Config) { c.Outlier.BaseEjection = time.Hour }, "Outlier.BaseEjection"},
		{"prefix without slash", func(c *Config) { c.KVPrefix = "gw" }, "KVPrefix"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := DefaultConfig()
			tc.edit(&c)
			err := c.Validate()
			if tc.field == "" {
				if err != nil {
					t.Fatalf("Validate: %v", err)
				}
				return
			}
			var ce *ConfigError
			if !errors.As(err, &ce) || ce.Field != tc.field {
				t.Fatalf("Validate = %v, want a *ConfigError on %s", err, tc.field)
			}
		})
	}
}
