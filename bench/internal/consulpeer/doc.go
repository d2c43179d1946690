// Package consulpeer provides Consul itself as a benchmark peer: it builds
// one Consul release from the Go module proxy into a cache outside the
// repository (Binary), and starts a cluster of real Consul server
// processes on loopback ports (StartCluster) that a benchmark drives
// through the Consul HTTP API, as it drives Lodestone's.
//
// The release is Version, v1.16.3: the last one under MPL-2.0. 1.16.4 and
// later are under the BSL and must not be used; nothing of Consul's code
// enters this repository, only the steps that build it.
//
// Building. The module zip of github.com/hashicorp/consul lacks the nested
// modules its go.mod replaces with local directories (./api, ./sdk, ...),
// so Binary downloads each at the version the release pinned (nested) and
// copies it into place in a writable copy of the module, then builds with
// CGO_ENABLED=0 and GOTOOLCHAIN=local. The checksum database has no entry
// for envoyextensions v0.4.1, so that one module is fetched with GONOSUMDB.
// A cold build takes minutes and about 2 GB of memory; its result is
// reused while `consul version` names Version; the copy of the source is
// removed once built. The cache is
// $XDG_CACHE_HOME/lodestone-bench/consul-1.16.3 (os.UserCacheDir), or
// $LODESTONE_BENCH_CACHE when set.
//
// Failure cases: a module download, copy or build that fails leaves no
// binary behind (the build writes a temporary file and renames it), and a
// binary in the cache that does not report Version is rebuilt.
//
// Clusters. StartCluster runs n servers (consul agent -server
// -bootstrap-expect n, not dev mode: Raft on disk with its default fsync),
// each on its own loopback ports with its own data dir, DNS and gRPC off,
// and waits until a leader has acknowledged a KV put. The caller stops
// them (Cluster.Stop), also on error.
package consulpeer
