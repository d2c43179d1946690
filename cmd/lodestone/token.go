package main

import (
	"os"
	"strings"

	"github.com/spf13/cobra"
)

// envToken names the environment variable that supplies the ACL token
// when neither --token nor --token-file is given.
const envToken = "LODESTONE_TOKEN"

// Keys of the root command's annotations that carry the environment's
// token and token file (newRootCmd reads the environment once).
const (
	annToken     = "env-token"
	annTokenFile = "env-token-file"
)

// tokenOf returns the ACL token a command sends: --token, then
// --token-file, then the environment (LODESTONE_TOKEN, CONSUL_HTTP_TOKEN,
// then their _FILE forms). None is the anonymous token ("").
func tokenOf(cmd *cobra.Command) (string, error) {
	f := cmd.Flags()
	if tok, _ := f.GetString("token"); tok != "" {
		return tok, nil
	}
	if path, _ := f.GetString("token-file"); path != "" {
		return readToken(cmd, "--token-file", path)
	}
	ann := cmd.Root().Annotations
	if tok := ann[annToken]; tok != "" {
		return tok, nil
	}
	if path := ann[annTokenFile]; path != "" {
		return readToken(cmd, envToken+"_FILE", path)
	}
	return "", nil
}

func readToken(cmd *cobra.Command, from, path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", usagef(cmd, "%s: %v", from, err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" || strings.ContainsAny(tok, " \t\r\n") {
		return "", usagef(cmd, "%s: %s must hold one token secret on one line", from, path)
	}
	return tok, nil
}

// firstEnv returns the first of names set to a non-blank value.
func firstEnv(getenv func(string) string, names ...string) string {
	for _, n := range names {
		if v := strings.TrimSpace(getenv(n)); v != "" {
			return v
		}
	}
	return ""
}
