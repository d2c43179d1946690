// Package peer carries Raft between members: one framed TCP stream per
// peer for ordinary messages (raftstream.go, whose frame format is written
// down there), a gRPC stream per snapshot so a large one never delays
// heartbeats, the follower's LeaderIndexStream to its leader
// (indexstream.go), and the Peer gRPC service that answers forwarded
// membership changes and leader transfers (service.go). Port serves all of
// it on one address, telling a Raft stream from HTTP/2 by its first bytes
// (peermux.go).
//
// Transport implements raftnode.Sender: Send never blocks; a message it
// cannot queue is dropped and the peer reported unreachable, as Raft
// expects of a lossy network. What arrives goes to its Node (Step), in
// order per stream; a snapshot is reassembled and verified before Raft
// sees it (below). A message from a removed member ends its stream
// with a rejection that says so, since a removed follower may never see
// its removal committed.
//
// # Cluster identity
//
// Every cluster has a 128-bit id, written as 32 hex digits
// (internal/clusterid), and the peer port serves only members of its own
// cluster (identity.go): a Raft stream's preamble, every peer gRPC call's
// metadata (lodestone-cluster-id) and a snapshot stream's first chunk
// carry the sender's id, and the receiver refuses none, a zero id, or
// another cluster's with PermissionDenied and an error naming both ("peer
// is in cluster X, this server is in cluster Y"), before anything reaches
// Raft or the member. A refusal is counted in
// lodestone_peer_refused_total{reason} and logged once a minute per
// remote host and reason. A forwarded conf change also names the cluster
// it announces its member for, and a leader of another cluster refuses it.
//
// Where the id comes from (server/clusterid.go):
//
//   - Founding members (InitialCluster, empty data dir, no Join) derive it:
//     SHA-256 over --cluster-token and the sorted name=address list, first
//     16 bytes, as etcd derives its cluster id. Each founder computes the
//     same id alone, so "refuse peers of another cluster" holds from the
//     very first message; a replicated entry proposed by the first leader
//     would leave every member open to anyone until that entry commits,
//     and would need a rule for members that heard nothing yet. The price:
//     two clusters bootstrapped with the same member list and token share
//     an id, so give each cluster its own token. A one-member cluster
//     without a token has no one to agree with and gets a random id.
//   - A joining member (Join) has no id until the first Raft stream, or
//     snapshot that passes every check, from a member it was told of
//     (SetPeer, from --initial-cluster) names one. It calls OnLearn, which
//     saves DATA_DIR/cluster-id, before it accepts the message. Until then
//     it refuses every peer call (FailedPrecondition), and its own calls
//     carry no id. This is trust on first use: the id is not a secret and
//     not a credential, it keeps apart clusters that were never meant to
//     meet (a stale member, a mistyped address); authenticating peers is
//     TLS's job.
//   - On restart the id is read from DATA_DIR/cluster-id. If the file is
//     missing, the id the data dir's snapshot names is taken; failing that
//     a non-joining member derives it as a founder would (data written by
//     an older build). A damaged file, or one that disagrees with the
//     snapshot, stops the server.
//
// Store snapshots (store/SNAPSHOT.md, from version 4) name their cluster. An
// offline `lodestone snapshot restore` keeps the saved cluster's id for the
// restored cluster (tools/snapshot/FORMAT.md); `lodestone recover` keeps
// the data dir's.
//
// Members of builds before cluster ids send Raft streams of preamble
// version 1 and calls without the metadata: they are refused, so a cluster
// moves to this build all at once (stop every member, start every member),
// not one member at a time.
//
// # Snapshot streams
//
// A snapshot stream's first chunk carries the MsgSnap, the sender's id and
// the data's size; the last carries the CRC-32C and SHA-256 of the data.
// The sender reads the data from the reader SendSnapshot was given (the
// snapshot's file) a chunk at a time, and sends the last chunk only once
// that reader reached its end without an error (a damaged file fails the
// send).
// The receiver refuses, before Raft sees it and changing nothing: a size
// over Config.MaxSnapshotBytes (--max-peer-snapshot-bytes), more chunks
// than Config.MaxSnapshotChunks, more or fewer bytes than announced, a
// stream that ends without its last chunk, a checksum mismatch, data that
// is not a store snapshot (store.VerifySnapshot decodes all of it), a
// state of another cluster or of none, or a state at another index than
// the message says. The whole snapshot is held in memory meanwhile, so the
// byte limit bounds that memory.
//
// Entry-less commit notices may wait up to Config.CommitNoticeHold for the
// next append to the same peer, which carries the same news, and are then
// dropped: under single writes that halves the Raft messages per write.
// Appends to a learner (SetLearners) may wait up to
// Config.LearnerAppendHold and go out folded into one (appendhold.go): a
// learner is in no quorum, so none of its acknowledgements is waited for.
package peer
