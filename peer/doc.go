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
// order per stream; a snapshot is reassembled and its checksum verified
// before Raft sees it. A message from a removed member ends its stream
// with a rejection that says so, since a removed follower may never see
// its removal committed.
//
// Entry-less commit notices may wait up to Config.CommitNoticeHold for the
// next append to the same peer, which carries the same news, and are then
// dropped: under single writes that halves the Raft messages per write.
package peer
