// Package k8s holds the Kubernetes manifests of a three-server Lodestone
// cluster with its gateway (*.yaml, kustomization.yaml), the script that
// makes their Secret (make-secret.sh), and the tests that keep them true:
//
//   - every document decodes strictly into the Kubernetes API type its
//     apiVersion and kind name (an unknown field or kind fails);
//   - what one object says about another holds: referenced Secrets,
//     ConfigMaps and keys exist, probes and Service target ports name
//     ports the process listens on, selectors select the pods meant,
//     --initial-cluster names the StatefulSet's members by their DNS names,
//     TLS files are mounted from the Secret;
//   - every lodestone command line parses with the real binary, and the
//     certificates make-secret.sh issues carry the names the pods dial;
//   - the pods' command lines run: a server, the ACL Job (twice) and the
//     gateway, as local processes with the generated Secret.
//
// The package has no code of its own, only these files and their tests.
package k8s
