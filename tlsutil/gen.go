package tlsutil

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// DefaultDomain is the domain certificate names live under.
const DefaultDomain = "lodestone"

// Kind is what a certificate is for.
type Kind string

const (
	// KindServer serves the client gRPC and HTTP ports; KindPeer serves
	// and dials the peer port. Both carry serverAuth and clientAuth, as
	// members dial each other.
	KindServer Kind = "server"
	KindPeer   Kind = "peer"
	// KindClient is presented by CLIs, agents and gateways: clientAuth only.
	KindClient Kind = "client"
)

// PEM is an issued certificate and its key, PEM encoded.
type PEM struct {
	Cert []byte
	Key  []byte
}

// CAOptions configures CreateCA.
type CAOptions struct {
	CommonName string    // default "Lodestone CA <domain>"
	Domain     string    // default DefaultDomain
	Days       int       // validity; default 1825
	NotBefore  time.Time // default now, less a minute of clock skew
}

// CreateCA issues a self-signed CA.
func CreateCA(o CAOptions) (PEM, error) {
	if o.Domain == "" {
		o.Domain = DefaultDomain
	}
	if o.CommonName == "" {
		o.CommonName = "Lodestone CA " + o.Domain
	}
	if o.Days == 0 {
		o.Days = 1825
	}
	if o.Days < 0 {
		return PEM{}, fmt.Errorf("days %d: must be positive", o.Days)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return PEM{}, err
	}
	nb := notBefore(o.NotBefore)
	tmpl := &x509.Certificate{
		SerialNumber:          serial(),
		Subject:               pkix.Name{CommonName: o.CommonName, Organization: []string{"Lodestone"}},
		NotBefore:             nb,
		NotAfter:              nb.AddDate(0, 0, o.Days),
		IsCA:                  true,
		BasicConstraintsValid: true,
		MaxPathLenZero:        true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		SubjectKeyId:          keyID(&key.PublicKey),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return PEM{}, err
	}
	return encode(der, key)
}

// CertOptions configures CreateCert.
type CertOptions struct {
	Kind Kind
	// Node names the member or client: server and peer certificates are
	// <node>.server.<domain>, client ones <node>.client.<domain>.
	Node   string
	Domain string // default DefaultDomain
	// DNSNames and IPs are added to the kind's own names.
	DNSNames  []string
	IPs       []net.IP
	Days      int       // validity; default 365
	NotBefore time.Time // default now, less a minute of clock skew
	// CA signs the certificate.
	CA PEM
}

// Names are the SANs a certificate of kind gets before additions, as
// `consul tls cert create` gives them: server and peer certificates
// server.<domain>, <node>.server.<domain>, localhost and 127.0.0.1;
// client ones client.<domain>, <node>.client.<domain> and localhost.
func Names(kind Kind, node, domain string) (dns []string, ips []net.IP) {
	if domain == "" {
		domain = DefaultDomain
	}
	role := "server"
	if kind == KindClient {
		role = "client"
	}
	dns = []string{role + "." + domain}
	if node != "" {
		dns = append(dns, node+"."+role+"."+domain)
	}
	dns = append(dns, "localhost")
	if kind != KindClient {
		ips = []net.IP{net.IPv4(127, 0, 0, 1)}
	}
	return dns, ips
}

// CreateCert issues a certificate of o.Kind signed by o.CA.
func CreateCert(o CertOptions) (PEM, error) {
	var usages []x509.ExtKeyUsage
	switch o.Kind {
	case KindServer, KindPeer:
		usages = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}
	case KindClient:
		usages = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	default:
		return PEM{}, fmt.Errorf("certificate kind %q: use server, peer or client", o.Kind)
	}
	if o.Node == "" || strings.ContainsAny(o.Node, "./ \t") {
		return PEM{}, fmt.Errorf("node %q: give a name without dots, slashes or spaces", o.Node)
	}
	if o.Days == 0 {
		o.Days = 365
	}
	if o.Days < 0 {
		return PEM{}, fmt.Errorf("days %d: must be positive", o.Days)
	}
	ca, err := tls.X509KeyPair(o.CA.Cert, o.CA.Key)
	if err != nil {
		return PEM{}, fmt.Errorf("CA certificate and key: %w", err)
	}
	if !ca.Leaf.IsCA {
		return PEM{}, errors.New("the CA certificate is not a CA (no CA basic constraint)")
	}
	dns, ips := Names(o.Kind, o.Node, o.Domain)
	dns = append(dns, o.DNSNames...)
	ips = append(ips, o.IPs...)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return PEM{}, err
	}
	nb := notBefore(o.NotBefore)
	na := nb.AddDate(0, 0, o.Days)
	if na.After(ca.Leaf.NotAfter) {
		na = ca.Leaf.NotAfter // NB: a chain is only valid while its CA is
	}
	tmpl := &x509.Certificate{
		SerialNumber:   serial(),
		Subject:        pkix.Name{CommonName: dns[1]},
		NotBefore:      nb,
		NotAfter:       na,
		KeyUsage:       x509.KeyUsageDigitalSignature,
		ExtKeyUsage:    usages,
		DNSNames:       dns,
		IPAddresses:    ips,
		SubjectKeyId:   keyID(&key.PublicKey),
		AuthorityKeyId: ca.Leaf.SubjectKeyId,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.Leaf, &key.PublicKey, ca.PrivateKey.(crypto.Signer))
	if err != nil {
		return PEM{}, err
	}
	return encode(der, key)
}

func notBefore(t time.Time) time.Time {
	if t.IsZero() {
		return time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	}
	return t
}

func serial() *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		panic(err) // crypto/rand does not fail
	}
	return n
}

func keyID(pub *ecdsa.PublicKey) []byte {
	der, _ := x509.MarshalPKIXPublicKey(pub)
	sum := sha256.Sum256(der)
	return sum[:20]
}

func encode(der []byte, key *ecdsa.PrivateKey) (PEM, error) {
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return PEM{}, err
	}
	return PEM{
		Cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		Key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}),
	}, nil
}

// WriteFiles writes p to certFile (0644) and keyFile (0600). It refuses to
// replace an existing file: reissuing over a live CA or key is a mistake
// that is hard to undo.
func WriteFiles(p PEM, certFile, keyFile string) error {
	for _, f := range []string{certFile, keyFile} {
		if _, err := os.Stat(f); err == nil {
			return fmt.Errorf("%s already exists; remove it or write elsewhere (--dir)", f)
		}
	}
	if err := os.MkdirAll(filepath.Dir(certFile), 0o755); err != nil {
		return err
	}
	if err := os.WriteFile(keyFile, p.Key, 0o600); err != nil {
		return err
	}
	return os.WriteFile(certFile, p.Cert, 0o644)
}
