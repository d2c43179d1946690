package main

import (
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

const (
	envHealthcheckURL     = "LODESTONE_HEALTHCHECK_URL"
	defaultHealthcheckURL = "http://127.0.0.1:8500/healthz"
	// healthcheckTimeout is short: a container runtime runs the check
	// every few seconds and kills one that hangs.
	healthcheckTimeout = 3 * time.Second
)

// newHealthcheckCmd builds `lodestone healthcheck`, the probe a container
// image runs: no shell or curl needed.
func newHealthcheckCmd(getenv func(string) string) *cobra.Command {
	def := defaultHealthcheckURL
	if env := strings.TrimSpace(getenv(envHealthcheckURL)); env != "" {
		def = env
	}
	var rawURL string
	cmd := &cobra.Command{
		Use:   "healthcheck",
		Short: "Exit 0 if a server's, agent's or gateway's /healthz answers 200, else 1 with why",
		Long: `GET a /healthz (a server's on its HTTP port, an agent's on --listen-http, a
gateway's on --admin) and exit 0 if it answers 200, else 1 with one line
saying why: for Docker's HEALTHCHECK and other probes, in images without a
shell. An https URL uses the client TLS flags (--ca-file, --cert-file,
--key-file, --tls-server-name, or their LODESTONE_* environment variables);
an http URL ignores them. --timeout is 3s here unless given.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			timeout := healthcheckTimeout
			if cmd.Flags().Changed("timeout") {
				timeout, _ = cmd.Flags().GetDuration("timeout")
			}
			return healthcheck(cmd, rawURL, timeout)
		},
	}
	cmd.Flags().StringVar(&rawURL, "url", def, "URL to GET (env "+envHealthcheckURL+")")
	return cmd
}

// healthcheck GETs rawURL once. Every failure, a bad URL included, is a
// plain error (exit 1): container runtimes read any other code as
// unhealthy too, but 1 is the one they document.
func healthcheck(cmd *cobra.Command, rawURL string, timeout time.Duration) error {
	u, err := url.Parse(rawURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--url %q: want http:// or https:// and a host, such as %s", rawURL, defaultHealthcheckURL)
	}
	if timeout <= 0 {
		return fmt.Errorf("--timeout %v: must be positive", timeout)
	}
	tr := &http.Transport{DisableKeepAlives: true}
	if u.Scheme == "https" {
		var tlsCfg *tls.Config
		if tlsCfg, err = clientTLS(cmd); err != nil {
			return errors.New(err.Error()) // NB: exit 1, not a usage error's 2
		}
		tr.TLSClientConfig = tlsCfg // nil: the system's roots
	}
	defer tr.CloseIdleConnections()
	c := &http.Client{Transport: tr, Timeout: timeout,
		// NB: a redirect is not health; report it as the answer it is.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	req, err := http.NewRequestWithContext(cmd.Context(), http.MethodGet, u.String(), nil)
	if err != nil {
		return fmt.Errorf("--url %q: %w", rawURL, err)
	}
	resp, err := c.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err
		}
		return fmt.Errorf("GET %s: %w", u, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	if resp.StatusCode != http.StatusOK {
		why := oneLine(string(body))
		if why == "" {
			why = "no body"
		}
		return fmt.Errorf("GET %s: %s: %s", u, resp.Status, why)
	}
	fmt.Fprintf(cmd.OutOrStdout(), "healthy: GET %s: %s\n", u, resp.Status)
	return nil
}
