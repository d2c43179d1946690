package tlsutil

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"time"
)

// Files names the PEM files of one TLS identity. Any may be empty (see
// Load for which combinations are allowed).
type Files struct {
	// CAFile is a bundle of CA certificates that verifies peers; during a
	// CA rotation it holds both the old and the new CA.
	CAFile string
	// CertFile is this side's certificate, optionally followed by
	// intermediates; KeyFile is its private key.
	CertFile string
	KeyFile  string
}

// material is one loaded generation of Files.
type material struct {
	cert *tls.Certificate // nil: no certificate configured
	pool *x509.CertPool   // nil: no CA configured
}

func (f Files) check() error {
	if (f.CertFile == "") != (f.KeyFile == "") {
		return fmt.Errorf("certificate %q and key %q: give both or neither", f.CertFile, f.KeyFile)
	}
	if f.CertFile == "" && f.CAFile == "" {
		return errors.New("no CA, certificate or key file given")
	}
	return nil
}

func load(f Files, now time.Time) (*material, error) {
	if err := f.check(); err != nil {
		return nil, err
	}
	m := &material{}
	if f.CAFile != "" {
		pool, err := loadPool(f.CAFile)
		if err != nil {
			return nil, err
		}
		m.pool = pool
	}
	if f.CertFile != "" {
		cert, err := loadPair(f.CertFile, f.KeyFile, now)
		if err != nil {
			return nil, err
		}
		if m.pool != nil {
			if err := verifyChain(cert, m.pool, now); err != nil {
				return nil, fmt.Errorf("certificate %s does not chain to the CA bundle %s: %w", f.CertFile, f.CAFile, err)
			}
		}
		m.cert = cert
	}
	return m, nil
}

func loadPool(file string) (*x509.CertPool, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	n := 0
	for rest := data; ; {
		var b *pem.Block
		b, rest = pem.Decode(rest)
		if b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, fmt.Errorf("CA file %s: certificate %d: %w", file, n+1, err)
		}
		pool.AddCert(c)
		n++
	}
	if n == 0 {
		return nil, fmt.Errorf("CA file %s holds no PEM CERTIFICATE block", file)
	}
	return pool, nil
}

func loadPair(certFile, keyFile string, now time.Time) (*tls.Certificate, error) {
	certPEM, err := os.ReadFile(certFile)
	if err != nil {
		return nil, fmt.Errorf("read certificate: %w", err)
	}
	keyPEM, err := os.ReadFile(keyFile)
	if err != nil {
		return nil, fmt.Errorf("read key: %w", err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return nil, fmt.Errorf("certificate %s with key %s: %w (the key must be the one the certificate was issued for)", certFile, keyFile, err)
	}
	leaf := pair.Leaf // NB: X509KeyPair parses it since Go 1.23
	if leaf == nil {
		if leaf, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return nil, fmt.Errorf("certificate %s: %w", certFile, err)
		}
		pair.Leaf = leaf
	}
	if now.After(leaf.NotAfter) {
		return nil, fmt.Errorf("certificate %s (serial %x) expired at %s; issue a new one (lodestone tls cert create)", certFile, leaf.SerialNumber, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	if now.Before(leaf.NotBefore) {
		return nil, fmt.Errorf("certificate %s (serial %x) is not valid until %s; check this host's clock", certFile, leaf.SerialNumber, leaf.NotBefore.UTC().Format(time.RFC3339))
	}
	return &pair, nil
}

// verifyChain checks that cert chains to pool, for any key usage.
func verifyChain(cert *tls.Certificate, pool *x509.CertPool, now time.Time) error {
	inter := x509.NewCertPool()
	for _, der := range cert.Certificate[1:] {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return err
		}
		inter.AddCert(c)
	}
	_, err := cert.Leaf.Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageAny}})
	return err
}

// verifyPeer verifies a peer's chain (rawCerts as the handshake carries
// them) against pool for usage; name, if set, must be one of its names.
func verifyPeer(rawCerts [][]byte, pool *x509.CertPool, usage x509.ExtKeyUsage, name string, now time.Time) error {
	if len(rawCerts) == 0 {
		return errors.New("no certificate presented")
	}
	certs := make([]*x509.Certificate, len(rawCerts))
	for i, der := range rawCerts {
		c, err := x509.ParseCertificate(der)
		if err != nil {
			return fmt.Errorf("parse peer certificate: %w", err)
		}
		certs[i] = c
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: pool, Intermediates: inter, CurrentTime: now,
		DNSName: name, KeyUsages: []x509.ExtKeyUsage{usage}})
	if err != nil {
		return &tls.CertificateVerificationError{UnverifiedCertificates: certs, Err: err}
	}
	return nil
}
