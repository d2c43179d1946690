// Package tlsutil is the one place Lodestone sets up TLS: it loads a CA
// bundle, a certificate and its key from PEM files, builds the *tls.Config
// of every listener and every dial from them, reloads them while serving,
// and issues the certificates `lodestone tls` writes.
//
// # Loading
//
// Load reads Files{CAFile, CertFile, KeyFile}. It refuses, with an error
// that names the file and says what to do:
//   - a file that is missing or unreadable;
//   - a CA file with no PEM CERTIFICATE block in it;
//   - a certificate without its key, or a key that is not the certificate's
//     (tls: private key does not match public key);
//   - a certificate that has expired, or is not valid yet, at load time;
//   - a certificate that does not chain to the CA bundle, when both are
//     given (a certificate from another cluster's CA is a mistake to catch
//     at start, not at the first handshake).
//
// CAFile alone (no certificate) is a client that verifies servers and
// presents nothing; CertFile and KeyFile alone serve without verifying
// clients (the gateway's front, whose clients are browsers).
//
// # Policy
//
// Every config has MinVersion TLS 1.2. TLS 1.3 uses crypto/tls's suites
// (all AEAD); TLS 1.2 is restricted to ECDHE key exchange with AES-GCM or
// ChaCha20-Poly1305 (CipherSuites). Server configs take a ClientAuth per
// listener: NoClientCert, OptionalClientCert (a certificate, if given, must
// verify) or RequireClientCert. ServerPolicy.ClientName additionally
// demands a DNS name in the client's certificate: the peer port admits
// only certificates that name server.<domain>, so a client certificate
// from the same CA cannot speak Raft.
//
// # Reload
//
// Reload re-reads all three files and swaps the new material in at once.
// Configs never hold material themselves: servers pick the certificate in
// GetCertificate and verify clients against the pool of the moment in
// VerifyPeerCertificate; clients pick theirs in GetClientCertificate and,
// when dialling a fixed server name (ClientConfig with a name, the peer
// dials), verify the server against the pool of the moment in
// VerifyConnection. So a reload drops no connection, and every handshake
// after it uses the new material. A reload that fails (any of the load
// errors above: a half-written file, a key that does not match yet) keeps
// the old material, logs at error level and counts
// lodestone_tls_reloads_total{cert,result="failure"}; a good one counts
// result="success". lodestone_tls_cert_not_after_seconds{cert} is the
// serving certificate's NotAfter in unix seconds, for expiry alerts.
//
// Watch polls the files once per interval (1s in the commands) and
// reloads when their contents have changed and then held still for one
// more interval. It polls rather than using inotify: Kubernetes secret
// volumes and cert-manager replace files by swapping symlinked
// directories and renaming, which file watches miss or see half done,
// while reading three small files a second costs nothing measurable.
// The commands also reload on SIGHUP.
//
// A client config made by ClientConfig with no server name (the CLI, the
// Go client dialling several endpoints by address) verifies the server
// against the CA pool as it was when the config was made, with crypto/tls's
// own verification, since only that sees the dialled address; its client
// certificate is still picked per handshake. A long-lived process that
// must follow a CA bundle change without a restart dials with a fixed
// server name (--tls-server-name server.<domain>).
//
// # Several certificates by SNI
//
// SNI serves one certificate per host name for the gateway's front: exact
// host, then a wildcard one label deep (*.example.com), then the default
// certificate; with none of these the handshake fails naming the host.
// It reloads as a whole: one bad pair keeps the whole old set.
//
// # Issuing
//
// CreateCA and CreateCert issue ECDSA P-256 keys and certificates;
// WriteFiles writes them with keys mode 0600 and never overwrites.
package tlsutil
