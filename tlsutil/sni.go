package tlsutil

import (
	"context"
	"crypto/tls"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// DefaultHost names an SNI entry's certificate as the default one.
const DefaultHost = "default"

// SNIEntry is one certificate of an SNI set and the host it serves: an
// exact name, a wildcard one label deep (*.example.com) or DefaultHost.
type SNIEntry struct {
	Host     string
	CertFile string
	KeyFile  string
}

// SNI serves a certificate per server name. Its methods may run
// concurrently.
type SNI struct {
	dir     string
	entries []SNIEntry
	opts    Options
	cur     atomic.Pointer[sniTable]
	mu      sync.Mutex
}

type sniTable struct {
	hosts map[string]*tls.Certificate // lower-case names, wildcards as "*.rest"
	def   *tls.Certificate
}

// LoadSNI loads entries and, if dir is set, every <name>.pem in dir with
// its <name>-key.pem: that certificate serves the DNS names it carries,
// and default.pem is the default. An explicit entry wins over the
// directory's for the same host.
func LoadSNI(dir string, entries []SNIEntry, opts Options) (*SNI, error) {
	opts.fill()
	s := &SNI{dir: dir, entries: entries, opts: opts}
	t, err := s.load()
	if err != nil {
		return nil, err
	}
	s.cur.Store(t)
	return s, nil
}

// dirEntries lists dir's certificate pairs.
func (s *SNI) dirEntries() ([]SNIEntry, error) {
	if s.dir == "" {
		return nil, nil
	}
	names, err := filepath.Glob(filepath.Join(s.dir, "*.pem"))
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []SNIEntry
	for _, n := range names {
		if strings.HasSuffix(n, "-key.pem") {
			continue
		}
		key := strings.TrimSuffix(n, ".pem") + "-key.pem"
		if _, err := os.Stat(key); err != nil {
			return nil, fmt.Errorf("TLS certificate directory %s: %s has no key %s", s.dir, filepath.Base(n), filepath.Base(key))
		}
		host := "" // from the certificate's names
		if filepath.Base(n) == DefaultHost+".pem" {
			host = DefaultHost
		}
		out = append(out, SNIEntry{Host: host, CertFile: n, KeyFile: key})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("TLS certificate directory %s holds no <name>.pem with <name>-key.pem", s.dir)
	}
	return out, nil
}

func (s *SNI) files() []string {
	var out []string
	des, _ := s.dirEntries()
	for _, e := range append(des, s.entries...) {
		out = append(out, e.CertFile, e.KeyFile)
	}
	return out
}

func (s *SNI) load() (*sniTable, error) {
	des, err := s.dirEntries()
	if err != nil {
		return nil, err
	}
	t := &sniTable{hosts: map[string]*tls.Certificate{}}
	now := s.opts.Now()
	var earliest time.Time
	for _, e := range append(des, s.entries...) {
		c, err := loadPair(e.CertFile, e.KeyFile, now)
		if err != nil {
			return nil, err
		}
		if earliest.IsZero() || c.Leaf.NotAfter.Before(earliest) {
			earliest = c.Leaf.NotAfter
		}
		hosts := []string{e.Host}
		if e.Host == "" {
			hosts = c.Leaf.DNSNames
		}
		for _, h := range hosts {
			if h == DefaultHost {
				t.def = c
				continue
			}
			t.hosts[strings.ToLower(h)] = c
		}
	}
	if len(t.hosts) == 0 && t.def == nil {
		return nil, fmt.Errorf("TLS %s: no certificate configured", s.opts.Name)
	}
	s.opts.Metrics.expiry(s.opts.Name, earliest)
	return t, nil
}

// Reload re-reads every certificate; on error the old set stays in use.
func (s *SNI) Reload() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.load()
	s.opts.Metrics.result(s.opts.Name, err)
	if err != nil {
		s.opts.Logger.Error("TLS reload failed; keeping the previous certificates", "cert", s.opts.Name, "err", err)
		return err
	}
	s.cur.Store(t)
	s.opts.Logger.Info("TLS certificates reloaded", "cert", s.opts.Name, "hosts", len(t.hosts), "default", t.def != nil)
	return nil
}

// Watch reloads the set when a file changes (Store.Watch's rules; the
// directory is listed again each time).
func (s *SNI) Watch(ctx context.Context, interval time.Duration) {
	watch(ctx, interval, s.files, s.Reload, s.opts.Logger)
}

// GetCertificate picks the certificate for hello's server name.
func (s *SNI) GetCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	t := s.cur.Load()
	name := strings.ToLower(strings.TrimSuffix(hello.ServerName, "."))
	if c, ok := t.hosts[name]; ok {
		return c, nil
	}
	if i := strings.IndexByte(name, '.'); i > 0 {
		if c, ok := t.hosts["*"+name[i:]]; ok {
			return c, nil
		}
	}
	if t.def != nil {
		return t.def, nil
	}
	return nil, fmt.Errorf("no certificate for server name %q and no default certificate", hello.ServerName)
}

// ServerConfig serves the set's certificates; it asks nothing of clients.
func (s *SNI) ServerConfig(nextProtos ...string) *tls.Config {
	cfg := base()
	cfg.NextProtos = nextProtos
	cfg.GetCertificate = s.GetCertificate
	return cfg
}
