package server

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/rpcstatus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// snapshotChunkBytes is the data carried by one SavedSnapshotChunk: well
// under gRPC's default 4 MiB receive limit.
const snapshotChunkBytes = 1 << 20

// adminService serves the operator RPCs: snapshot save and the admission
// policy. Admission control never gates it.
type adminService struct {
	lodestonepb.UnimplementedAdminServer
	s   *core
	adm *admission
}

// SaveSnapshot streams the state as of a linearizable read: everything
// acknowledged before the call is in it. The header comes first, then the
// data in chunks, then the SHA-256 of the data.
func (a *adminService) SaveSnapshot(_ *lodestonepb.SaveSnapshotRequest, stream lodestonepb.Admin_SaveSnapshotServer) error {
	hdr, data, err := a.s.liveSnapshot(stream.Context())
	if err != nil {
		return err
	}
	if err := stream.Send(&lodestonepb.SavedSnapshotChunk{Header: hdr}); err != nil {
		return err
	}
	for off := 0; off < len(data); off += snapshotChunkBytes {
		end := min(off+snapshotChunkBytes, len(data))
		if err := stream.Send(&lodestonepb.SavedSnapshotChunk{Data: data[off:end]}); err != nil {
			return err
		}
	}
	sum := sha256.Sum256(data)
	a.s.logger.Info("snapshot streamed to operator", "index", hdr.Index, "term", hdr.Term, "bytes", len(data))
	return stream.Send(&lodestonepb.SavedSnapshotChunk{Sha256: sum[:]})
}

// liveSnapshot encodes the state as of a linearizable read (everything
// acknowledged before the call is in it) with the header an operator's
// snapshot file carries.
func (s *core) liveSnapshot(ctx context.Context) (*lodestonepb.SavedSnapshotHeader, []byte, error) {
	if _, err := s.raft.ReadIndex(ctx); err != nil {
		return nil, nil, rpcstatus.Of(err)
	}
	ls, err := s.raft.Snapshot(ctx)
	if err != nil {
		return nil, nil, rpcstatus.Of(err)
	}
	var buf bytes.Buffer
	_, err = ls.Snap.WriteTo(&buf)
	ls.Snap.Close()
	if err != nil {
		return nil, nil, rpcstatus.Of(fmt.Errorf("encode snapshot: %w", err))
	}
	data := buf.Bytes()
	voters := append([]uint64(nil), ls.Conf.Voters...)
	sort.Slice(voters, func(i, j int) bool { return voters[i] < voters[j] })
	learners := append([]uint64(nil), ls.Conf.Learners...)
	sort.Slice(learners, func(i, j int) bool { return learners[i] < learners[j] })
	hdr := &lodestonepb.SavedSnapshotHeader{
		Index: ls.Snap.Index(), Term: ls.Term, Voters: voters, Learners: learners,
		Size: uint64(len(data)), Member: s.cfg.Name,
	}
	return hdr, data, nil
}

// SetAdmission replicates a new policy; enabled=false turns it off.
func (a *adminService) SetAdmission(ctx context.Context, req *lodestonepb.SetAdmissionRequest) (*lodestonepb.SetAdmissionResponse, error) {
	p := proto.CloneOf(req.GetPolicy())
	if p == nil {
		p = &lodestonepb.AdmissionPolicy{}
	}
	if r := p.GetRampPercentPerMin(); r < 0 || r > 100 || math.IsNaN(r) {
		return nil, status.Errorf(codes.InvalidArgument, "ramp %v%%/min: want 0 (no ramp) to 100", r)
	}
	if p.GetEnabled() && p.GetReads() == 0 && p.GetWrites() == 0 && p.GetWatches() == 0 && p.GetConnections() == 0 {
		return nil, status.Error(codes.InvalidArgument, "an enabled policy needs a limit for reads, writes, watches or connections")
	}
	now := time.Now().UnixNano()
	p.SetUnixNano = now
	res, err := a.s.raft.Propose(ctx, &lodestonepb.Command{Op: &lodestonepb.Command_Admission{Admission: p}, TimeUnixNano: now})
	if err != nil {
		return nil, rpcstatus.Of(err)
	}
	return &lodestonepb.SetAdmissionResponse{Policy: p, Index: res.Index}, nil
}

// GetAdmission returns the policy this server enforces.
func (a *adminService) GetAdmission(ctx context.Context, _ *lodestonepb.GetAdmissionRequest) (*lodestonepb.GetAdmissionResponse, error) {
	if _, err := a.s.raft.ReadIndex(ctx); err != nil {
		return nil, rpcstatus.Of(err)
	}
	now := time.Now()
	p := a.adm.policy(now)
	if p == nil {
		return &lodestonepb.GetAdmissionResponse{Policy: &lodestonepb.AdmissionPolicy{}}, nil
	}
	return &lodestonepb.GetAdmissionResponse{Policy: p, CurrentPercent: 100 * rampFraction(p, a.adm.started, now)}, nil
}
