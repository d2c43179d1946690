package ui

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/lodestone-kv/lodestone/internal/promwin"
	"github.com/lodestone-kv/lodestone/internal/svgchart"
	"github.com/lodestone-kv/lodestone/internal/webui"
	"github.com/lodestone-kv/lodestone/raftlog"
)

// The metric names the pages read; TestUIMetricsAreExported checks that a
// real server exports every one.
const (
	mIsLeader        = "lodestone_is_leader"
	mTerm            = "lodestone_raft_term"
	mCommitIndex     = "lodestone_raft_commit_index"
	mAppliedIndex    = "lodestone_raft_applied_index"
	mLeaderChanges   = "lodestone_leader_changes_total"
	mCommitLatency   = "lodestone_commit_latency_seconds"
	mFsyncLatency    = "lodestone_log_write_latency_seconds"
	mAppendAck       = "lodestone_peer_append_ack_seconds"
	mBuildInfo       = "lodestone_build_info"
	mAdmissionLimit  = "lodestone_admission_limit_per_second"
	mAdmissionReject = "lodestone_admission_rejected_total"

	mLogFile        = "lodestone_raftlog_file_bytes"
	mLogLive        = "lodestone_raftlog_live_bytes"
	mLogFreePages   = "lodestone_raftlog_free_pages"
	mLogFreeBytes   = "lodestone_raftlog_free_bytes"
	mLogFreelist    = "lodestone_raftlog_freelist_bytes"
	mLogLastWrite   = "lodestone_raftlog_last_commit_write_bytes"
	mLogCheckpoints = "lodestone_raftlog_checkpoints_total"
	mLogJournal     = "lodestone_raftlog_journal_bytes"
	mLogRotations   = "lodestone_raftlog_rotations_total"
	mLogRotFailures = "lodestone_raftlog_rotation_failures_total"
	mLogRotating    = "lodestone_raftlog_rotation_in_progress"
	mLogRotLast     = "lodestone_raftlog_last_rotation_duration_seconds"
	mLogRotPause    = "lodestone_raftlog_rotation_pause_seconds"
	mLogSnapshot    = "lodestone_raftlog_snapshot_index"
	mLogFirst       = "lodestone_raftlog_first_index"
	mLogLast        = "lodestone_raftlog_last_index"
	mLogSave        = "lodestone_raftlog_save_duration_seconds"

	mWatchStreams = "lodestone_watch_streams"
	mWatchers     = "lodestone_watch_watchers"
	mShardLag     = "lodestone_watch_shard_lag_entries"
	mDeliveryLag  = "lodestone_watch_delivery_lag_seconds"
	mWatchersCut  = "lodestone_watch_watchers_cut_total"
	mRetained     = "lodestone_watch_retained_events"
	mPublished    = "lodestone_watch_events_published_total"
	mParked       = "lodestone_http_parked_requests"
	mBlocking     = "lodestone_blocking_queries_in_flight"
)

// MetricNames lists every metric the pages read.
var MetricNames = []string{
	mIsLeader, mTerm, mCommitIndex, mAppliedIndex, mLeaderChanges, mCommitLatency, mFsyncLatency, mAppendAck,
	mBuildInfo, mAdmissionLimit, mAdmissionReject,
	mLogFile, mLogLive, mLogFreePages, mLogFreeBytes, mLogFreelist, mLogLastWrite, mLogCheckpoints, mLogJournal,
	mLogRotations, mLogRotFailures, mLogRotating, mLogRotLast, mLogRotPause, mLogSnapshot, mLogFirst, mLogLast, mLogSave,
	mWatchStreams, mWatchers, mShardLag, mDeliveryLag, mWatchersCut, mRetained, mPublished, mParked, mBlocking,
}

// pageRefreshWait is how long a page waits for the members' samples;
// what has not come by then shows as the previous sample.
const pageRefreshWait = time.Second

func (u *UI) sampleFleet(ctx context.Context) []memberStat {
	ctx, cancel := context.WithTimeout(ctx, pageRefreshWait)
	defer cancel()
	return u.fleet.refresh(ctx)
}

// memberRow is one member on the cluster page.
type memberRow struct {
	Name, ID, HTTP   string
	Self             bool
	Role, RoleClass  string
	Reachable        bool
	Err              string
	SampleAge        string
	Version          string
	Term             float64
	Commit, Applied  float64
	Behind           float64 // entries behind the leader's commit
	LastContact      string
	AckP99           float64 // the leader's append-to-acknowledgement p99 for this member
	FsyncP99         float64
	CommitP99        float64
	LeaderChanges    float64
	LeaderChangesWin float64
}

type clusterData struct {
	Now                time.Time
	Self               string
	Leader             string
	KnownLeader        bool
	Term, Commit       uint64
	Applied            uint64
	Rows               []memberRow
	Voters, VotersUp   int
	Quorum             int
	QuorumOK           bool
	CommitHist         []float64
	FsyncHist          []float64
	Admission          admissionView
	LeaderChangesLocal float64
}

type admissionView struct {
	Enabled               bool
	Reads, Writes, Watchs uint64
	RampPerMin            float64
	Fraction              float64
	SetAt                 time.Time
	Classes               []admissionClass
}

type admissionClass struct {
	Class        string
	Limit        float64
	RejectedRate float64
	Rejected     float64
}

func (u *UI) cluster(ctx context.Context, r *http.Request, rc *request) (*built, error) {
	stats := u.sampleFleet(ctx)
	st := u.b.Raft()
	name, selfID := u.b.Self()
	d := &clusterData{Now: time.Now(), Self: name, KnownLeader: st.Lead != 0, Term: st.Term, Commit: st.Commit, Applied: st.Applied}
	var leader memberStat
	for _, ms := range stats {
		if ms.m.Id == st.Lead {
			leader = ms
			d.Leader = ms.m.Name
		}
	}
	leaderCommit := st.Commit
	if leader.reachable() {
		leaderCommit = uint64(leader.sample.Value(mCommitIndex))
	}
	for _, ms := range stats {
		row := memberRow{Name: ms.m.Name, ID: strconv.FormatUint(ms.m.Id, 16), HTTP: ms.m.HttpAddr, Self: ms.self,
			Reachable: ms.reachable(), Term: math.NaN(), Commit: math.NaN(), Applied: math.NaN(), Behind: math.NaN(),
			AckP99: math.NaN(), FsyncP99: math.NaN(), CommitP99: math.NaN(), LeaderChanges: math.NaN(), LeaderChangesWin: math.NaN()}
		if ms.err != nil {
			row.Err = ms.err.Error()
		}
		if ms.sample != nil {
			row.SampleAge = webui.Ago(time.Since(ms.sample.At))
		}
		role, class := "follower", "follower"
		switch {
		case ms.m.Learner && ms.m.AutoPromote:
			role, class = "learner (auto-promote)", "learner"
		case ms.m.Learner:
			role, class = "learner", "learner"
		case ms.m.Id == st.Lead:
			role, class = "leader", "leader"
		}
		if !ms.m.Learner {
			d.Voters++
		}
		if row.Reachable {
			s, w := ms.sample, ms.win
			if s.Value(mIsLeader) == 1 {
				role, class = "leader", "leader"
			}
			row.Version = s.Label(mBuildInfo, "version")
			row.Term, row.Commit, row.Applied = s.Value(mTerm), s.Value(mCommitIndex), s.Value(mAppliedIndex)
			row.Behind = math.Max(0, float64(leaderCommit)-row.Applied)
			row.FsyncP99 = w.Quantile(0.99, mFsyncLatency)
			row.CommitP99 = w.Quantile(0.99, mCommitLatency)
			row.LeaderChanges = s.Value(mLeaderChanges)
			row.LeaderChangesWin = w.Increase(mLeaderChanges)
			if !ms.m.Learner {
				d.VotersUp++
			}
		} else {
			role, class = "unreachable", "unreachable"
		}
		row.Role, row.RoleClass = role, class
		if leader.reachable() && ms.m.Id != st.Lead {
			row.AckP99 = leader.win.Quantile(0.99, mAppendAck, "peer", row.ID)
		}
		switch {
		case ms.m.Id == selfID:
			row.LastContact = "this member"
		default:
			if at, ok := u.b.LastHeard(ms.m.Id); ok {
				row.LastContact = webui.Ago(time.Since(at)) + " ago"
			} else {
				row.LastContact = "never (only the leader hears every member)"
			}
		}
		d.Rows = append(d.Rows, row)
	}
	d.Quorum = d.Voters/2 + 1
	d.QuorumOK = d.VotersUp >= d.Quorum
	self := u.fleet.self(stats)
	if self.sampler != nil {
		d.CommitHist = self.sampler.Steps(func(w promwin.Window) float64 { return w.Quantile(0.99, mCommitLatency) })
		d.FsyncHist = self.sampler.Steps(func(w promwin.Window) float64 { return w.Quantile(0.99, mFsyncLatency) })
		d.LeaderChangesLocal = self.sample.Value(mLeaderChanges)
	}
	d.Admission = u.admission(self)
	return &built{title: "Cluster", data: d, wait: u.tick}, nil
}

func (u *UI) admission(self memberStat) admissionView {
	p, fraction := u.b.Admission()
	v := admissionView{Enabled: p.GetEnabled(), Reads: p.GetReads(), Writes: p.GetWrites(), Watchs: p.GetWatches(),
		RampPerMin: p.GetRampPercentPerMin(), Fraction: fraction}
	if p.GetSetUnixNano() != 0 {
		v.SetAt = time.Unix(0, p.GetSetUnixNano())
	}
	if self.sample != nil {
		for _, c := range []string{"read", "write", "watch"} {
			v.Classes = append(v.Classes, admissionClass{Class: c, Limit: self.sample.Value(mAdmissionLimit, "class", c),
				Rejected: self.sample.Value(mAdmissionReject, "class", c), RejectedRate: self.win.Rate(mAdmissionReject, "class", c)})
		}
	}
	return v
}

// logRow is one member's raft.db on the Raft log page.
type logRow struct {
	Name                    string
	Self, Reachable         bool
	Err                     string
	File, Live, Free        float64
	FreePages, Freelist     float64
	FreeRatio               float64
	LastWrite               float64
	Checkpoints, Journal    float64
	Rotations, Failures     float64
	FailuresWin             float64
	Rotating                bool
	LastRotation, PauseP99  float64
	SaveP99                 float64
	Snapshot, First, LastIx float64
	Bloated                 bool
	Fill                    []svgchart.Bar
}

type raftlogData struct {
	Now          time.Time
	Rows         []logRow
	Warnings     []bloatWarning
	FileHist     []float64
	LiveHist     []float64
	WriteHist    []float64
	RatioPct     float64
	MinBytes     float64
	DataDir      string
	RunbookShown bool
}

// bloatWarning is a member whose raft.db is past the rotation threshold,
// or whose rotations fail, with what the runbook says to run.
type bloatWarning struct {
	Member   string
	Why      string
	Commands []string
}

func (u *UI) raftlog(ctx context.Context, r *http.Request, rc *request) (*built, error) {
	stats := u.sampleFleet(ctx)
	d := &raftlogData{Now: time.Now(), RatioPct: raftlog.DefaultRotateFreeRatio * 100, MinBytes: raftlog.DefaultRotateMinBytes, DataDir: u.b.DataDir()}
	for _, ms := range stats {
		row := logRow{Name: ms.m.Name, Self: ms.self, Reachable: ms.reachable()}
		if ms.err != nil {
			row.Err = ms.err.Error()
		}
		if !row.Reachable {
			d.Rows = append(d.Rows, row)
			continue
		}
		s, w := ms.sample, ms.win
		row.File, row.Live, row.Free = s.Value(mLogFile), s.Value(mLogLive), s.Value(mLogFreeBytes)
		row.FreePages, row.Freelist, row.LastWrite = s.Value(mLogFreePages), s.Value(mLogFreelist), s.Value(mLogLastWrite)
		row.Checkpoints, row.Journal = s.Value(mLogCheckpoints), s.Value(mLogJournal)
		row.Rotations, row.Failures, row.FailuresWin = s.Value(mLogRotations), s.Value(mLogRotFailures), w.Increase(mLogRotFailures)
		row.Rotating = s.Value(mLogRotating) == 1
		row.LastRotation, row.PauseP99 = s.Value(mLogRotLast), w.Quantile(0.99, mLogRotPause)
		row.SaveP99 = w.Quantile(0.99, mLogSave)
		row.Snapshot, row.First, row.LastIx = s.Value(mLogSnapshot), s.Value(mLogFirst), s.Value(mLogLast)
		if row.File > 0 {
			row.FreeRatio = row.Free / row.File
		}
		row.Bloated = row.File >= raftlog.DefaultRotateMinBytes && row.FreeRatio > raftlog.DefaultRotateFreeRatio
		freeClass := "ok"
		if row.Bloated {
			freeClass = "bad"
		}
		row.Fill = []svgchart.Bar{{Label: "live", Value: row.Live, Text: webui.Bytes(row.Live)},
			{Label: "free", Value: row.Free, Class: freeClass, Text: webui.Bytes(row.Free)}}
		dataDir := "$DATA_DIR"
		if ms.self {
			dataDir = d.DataDir
		}
		metricsURL := "http://" + ms.m.HttpAddr + "/metrics"
		switch {
		case row.Bloated:
			d.Warnings = append(d.Warnings, bloatWarning{Member: ms.m.Name, Why: fmt.Sprintf(
				"raft.db is %s of which %s (%.0f%%) is free pages: past the rotation threshold (over %.0f%% free in a file of at least %s). "+
					"The server should rotate it within minutes; if lodestone_raftlog_rotations_total stays flat or rotation failures rise, follow docs/runbooks/raft-log-bloat.md.",
				webui.Bytes(row.File), webui.Bytes(row.Free), row.FreeRatio*100, d.RatioPct, webui.Bytes(d.MinBytes)),
				Commands: []string{
					"curl -s " + metricsURL + " | grep -E '^lodestone_raftlog_rotation'",
					"lodestone compact --inspect --data-dir " + dataDir + "   # on the stopped node",
					"lodestone compact --data-dir " + dataDir + "   # on the stopped node: needs free disk for one copy of the live data",
				}})
		case row.FailuresWin > 0:
			d.Warnings = append(d.Warnings, bloatWarning{Member: ms.m.Name, Why: fmt.Sprintf(
				"%s rotation(s) of raft.db failed in the last minute; the old file stays in use. The server log's 'raftlog rotation failed' line says why (almost always disk space for one copy of the live data, %s).",
				webui.Num(row.FailuresWin), webui.Bytes(row.Live)),
				Commands: []string{"curl -s " + metricsURL + " | grep -E '^lodestone_raftlog_rotation'", "df -h " + dataDir}})
		}
		d.Rows = append(d.Rows, row)
	}
	self := u.fleet.self(stats)
	if self.sampler != nil {
		d.FileHist = self.sampler.History(func(s *promwin.Sample) float64 { return s.Value(mLogFile) })
		d.LiveHist = self.sampler.History(func(s *promwin.Sample) float64 { return s.Value(mLogLive) })
		d.WriteHist = self.sampler.History(func(s *promwin.Sample) float64 { return s.Value(mLogLastWrite) })
	}
	return &built{title: "Raft log health", data: d, wait: u.tick}, nil
}

// watchRow is one member on the watches page.
type watchRow struct {
	Name                  string
	Self, Reachable       bool
	Err                   string
	Streams, Watchers     float64
	Parked, Blocking      float64
	LagP50, LagP99        float64
	Cut, CutWin           float64
	Retained, MaxShardLag float64
	PublishedRate         float64
}

type watchesData struct {
	Now      time.Time
	Rows     []watchRow
	Shards   []svgchart.Bar
	ShardLag []svgchart.Bar
	Cuts     []cutRow
	LagHist  []float64
}

type cutRow struct {
	Reason       string
	Total, InWin float64
}

func (u *UI) watches(ctx context.Context, r *http.Request, rc *request) (*built, error) {
	stats := u.sampleFleet(ctx)
	d := &watchesData{Now: time.Now()}
	for _, ms := range stats {
		row := watchRow{Name: ms.m.Name, Self: ms.self, Reachable: ms.reachable()}
		if ms.err != nil {
			row.Err = ms.err.Error()
		}
		if row.Reachable {
			s, w := ms.sample, ms.win
			row.Streams, row.Watchers = s.Value(mWatchStreams), s.Value(mWatchers)
			row.Parked, row.Blocking = s.Value(mParked), s.Value(mBlocking)
			row.LagP50, row.LagP99 = w.Quantile(0.5, mDeliveryLag), w.Quantile(0.99, mDeliveryLag)
			row.Cut, row.CutWin = s.Value(mWatchersCut), w.Increase(mWatchersCut)
			row.Retained = s.Value(mRetained)
			row.PublishedRate = w.Rate(mPublished)
			s.Each(mShardLag, func(se promwin.Series) { row.MaxShardLag = math.Max(row.MaxShardLag, se.Value) })
		}
		d.Rows = append(d.Rows, row)
	}
	self := u.fleet.self(stats)
	if self.sample != nil {
		shards := self.sample.LabelValues(mWatchers, "shard")
		slices.SortFunc(shards, func(a, b string) int { x, _ := strconv.Atoi(a); y, _ := strconv.Atoi(b); return x - y })
		for _, sh := range shards {
			d.Shards = append(d.Shards, svgchart.Bar{Label: "shard " + sh, Value: self.sample.Value(mWatchers, "shard", sh)})
			lag := self.sample.Value(mShardLag, "shard", sh)
			class := "ok"
			if lag > 0 {
				class = "warn"
			}
			d.ShardLag = append(d.ShardLag, svgchart.Bar{Label: "shard " + sh, Value: lag, Class: class})
		}
		for _, reason := range self.sample.LabelValues(mWatchersCut, "reason") {
			d.Cuts = append(d.Cuts, cutRow{Reason: reason, Total: self.sample.Value(mWatchersCut, "reason", reason),
				InWin: self.win.Increase(mWatchersCut, "reason", reason)})
		}
		d.LagHist = self.sampler.Steps(func(w promwin.Window) float64 { return w.Quantile(0.99, mDeliveryLag) })
	}
	return &built{title: "Watches and blocking queries", data: d, wait: u.tick}, nil
}
