// Package deploy holds the tests of Lodestone's deployment files: the
// container image and compose cluster (compose/), the Kubernetes manifests
// (k8s/) and the systemd unit (systemd/). It is a module of its own so the
// Kubernetes API types its checks decode with stay out of the server's
// dependencies.
package deploy
