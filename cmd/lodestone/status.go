package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"

	"github.com/spf13/cobra"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/client"
)

type statusOptions struct {
	Client clientOptions
	// Cluster asks every member the membership lists instead of only
	// --endpoints.
	Cluster bool
	Output  string
}

func newStatusCmd() *cobra.Command {
	var o statusOptions
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show each server's Raft state and Raft log health",
		Long: `Show, for each endpoint (or with --cluster each member), the server's view:
its Raft state, the leader, term, commit and applied index, its Raft log:
first and last index, file size, free pages and freelist size, and the
version the server runs.

It exits non-zero when any server did not answer.`,
		Args: noArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var err error
			if o.Client, err = clientOutputFlags(cmd, o.Output); err != nil {
				return err
			}
			return runStatus(cmd.Context(), o, cmd.OutOrStdout())
		},
	}
	cmd.Flags().BoolVar(&o.Cluster, "cluster", false, "ask every member in the membership, not only --endpoints")
	addOutputFlag(cmd, &o.Output)
	return cmd
}

// endpointStatus is one server's answer, or why there is none.
type endpointStatus struct {
	Endpoint string
	Status   *lodestonepb.StatusResponse
	Err      error
}

func runStatus(ctx context.Context, o statusOptions, w io.Writer) error {
	return withClient(ctx, o.Client, func(ctx context.Context, c *client.Client) error {
		endpoints := o.Client.Endpoints
		if o.Cluster {
			resp, err := c.Members(ctx)
			if err != nil {
				return explain(err, o.Client, "")
			}
			endpoints = nil
			for _, m := range sortedMembers(resp.GetMembers()) {
				if m.GetGrpcAddr() != "" {
					endpoints = append(endpoints, m.GetGrpcAddr())
				}
			}
		}
		results := make([]endpointStatus, len(endpoints))
		var wg sync.WaitGroup
		for i, ep := range endpoints {
			wg.Go(func() {
				resp, err := c.Status(ctx, ep)
				results[i] = endpointStatus{Endpoint: ep, Status: resp, Err: err}
			})
		}
		wg.Wait()
		if err := renderStatus(w, o.Output, results); err != nil {
			return err
		}
		var failed []string
		var first error
		for _, r := range results {
			if r.Err != nil {
				failed = append(failed, r.Endpoint)
				if first == nil {
					first = r.Err
				}
			}
		}
		switch {
		case len(failed) == 0:
			return nil
		case len(failed) == len(results):
			return explain(first, o.Client, "")
		}
		return fmt.Errorf("%d of %d servers did not answer (%s): check that they run and are reachable",
			len(failed), len(results), strings.Join(failed, ", "))
	})
}

// jsonStatus is one server's status as -o json prints it.
type jsonStatus struct {
	Endpoint     string   `json:"endpoint"`
	ID           string   `json:"id,omitempty"`
	Name         string   `json:"name,omitempty"`
	RaftState    string   `json:"raft_state,omitempty"`
	LeaderID     string   `json:"leader_id,omitempty"`
	LeaderName   string   `json:"leader_name,omitempty"`
	Term         uint64   `json:"term,omitempty"`
	CommitIndex  uint64   `json:"commit_index,omitempty"`
	AppliedIndex uint64   `json:"applied_index,omitempty"`
	Version      string   `json:"version,omitempty"`
	Log          *jsonLog `json:"log,omitempty"`
	Error        string   `json:"error,omitempty"`
}

type jsonLog struct {
	FirstIndex    uint64 `json:"first_index"`
	LastIndex     uint64 `json:"last_index"`
	SnapshotIndex uint64 `json:"snapshot_index"`
	FileBytes     uint64 `json:"file_bytes"`
	FreePages     uint64 `json:"free_pages"`
	PendingPages  uint64 `json:"pending_pages"`
	FreeBytes     uint64 `json:"free_bytes"`
	FreelistBytes uint64 `json:"freelist_bytes"`
}

// raftState shortens "StateLeader" to "leader".
func raftState(s string) string {
	if s == "" {
		return "-"
	}
	return strings.ToLower(strings.TrimPrefix(s, "State"))
}

func leaderLabel(s *lodestonepb.StatusResponse) string {
	switch {
	case s.GetLeaderName() != "":
		return s.GetLeaderName()
	case s.GetLeaderId() != 0:
		return hexID(s.GetLeaderId())
	}
	return "none"
}

// renderStatus prints one row (or JSON object) per endpoint, in the order
// given. The table has an ERROR column only when some endpoint failed.
func renderStatus(w io.Writer, format string, results []endpointStatus) error {
	if format == outputJSON {
		out := make([]jsonStatus, 0, len(results))
		for _, r := range results {
			j := jsonStatus{Endpoint: r.Endpoint}
			if r.Err != nil {
				j.Error = oneLine(strings.TrimPrefix(r.Err.Error(), "client: "))
				out = append(out, j)
				continue
			}
			s := r.Status
			j.ID, j.Name = hexID(s.GetSelf().GetId()), s.GetSelf().GetName()
			j.RaftState, j.LeaderID, j.LeaderName = raftState(s.GetRaftState()), hexID(s.GetLeaderId()), s.GetLeaderName()
			j.Term, j.CommitIndex, j.AppliedIndex, j.Version = s.GetTerm(), s.GetCommitIndex(), s.GetAppliedIndex(), s.GetVersion()
			if l := s.GetLog(); l != nil {
				j.Log = &jsonLog{
					FirstIndex: l.GetFirstIndex(), LastIndex: l.GetLastIndex(), SnapshotIndex: l.GetSnapshotIndex(),
					FileBytes: l.GetFileBytes(), FreePages: l.GetFreePages(), PendingPages: l.GetPendingPages(),
					FreeBytes: l.GetFreeBytes(), FreelistBytes: l.GetFreelistBytes(),
				}
			}
			out = append(out, j)
		}
		return writeJSON(w, out)
	}
	anyErr := false
	for _, r := range results {
		anyErr = anyErr || r.Err != nil
	}
	tw := newTable(w)
	header := []any{"ENDPOINT", "NAME", "ID", "STATE", "LEADER", "TERM", "COMMIT", "APPLIED",
		"LOG-FIRST", "LOG-LAST", "FILE-SIZE", "FREE-PAGES", "FREELIST-SIZE", "VERSION"}
	if anyErr {
		header = append(header, "ERROR")
	}
	tw.row(header...)
	for _, r := range results {
		if r.Err != nil {
			cells := []any{r.Endpoint, "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-", "-"}
			tw.row(append(cells, oneLine(strings.TrimPrefix(r.Err.Error(), "client: ")))...)
			continue
		}
		s, l := r.Status, r.Status.GetLog()
		cells := []any{r.Endpoint, dash(s.GetSelf().GetName()), hexID(s.GetSelf().GetId()), raftState(s.GetRaftState()),
			leaderLabel(s), s.GetTerm(), s.GetCommitIndex(), s.GetAppliedIndex()}
		if l != nil {
			cells = append(cells, l.GetFirstIndex(), l.GetLastIndex(), humanBytes(l.GetFileBytes()), l.GetFreePages(), humanBytes(l.GetFreelistBytes()))
		} else {
			cells = append(cells, "-", "-", "-", "-", "-")
		}
		cells = append(cells, dash(s.GetVersion()))
		if anyErr {
			cells = append(cells, "")
		}
		tw.row(cells...)
	}
	return tw.flush()
}

// humanBytes renders n with a binary unit: 512 B, 32 KiB, 7.8 MiB.
func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit && exp < 5; m /= unit {
		div *= unit
		exp++
	}
	v := float64(n) / float64(div)
	suffix := "KMGTPE"[exp : exp+1]
	if v >= 100 || v == float64(uint64(v)) {
		return fmt.Sprintf("%.0f %siB", v, suffix)
	}
	return fmt.Sprintf("%.1f %siB", v, suffix)
}
