package server

import "fmt"

// ConfigError names the Config field that is wrong and why.
type ConfigError struct {
	Field string
	Err   error
}

func (e *ConfigError) Error() string { return fmt.Sprintf("config %s: %v", e.Field, e.Err) }
func (e *ConfigError) Unwrap() error { return e.Err }
