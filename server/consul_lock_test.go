package server

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	consul "github.com/hashicorp/consul/api"
)

// The cross-process lock tests re-run this test binary as helper processes
// (TestLockHelperProcess), so mutual exclusion is checked between real OS
// processes that share nothing but the cluster and a marker file.
const (
	lockHelperMode  = "LODESTONE_TEST_LOCK_MODE" // "count" or "hold"
	lockHelperAddr  = "LODESTONE_TEST_LOCK_ADDR" // a member's HTTP address
	lockHelperDir   = "LODESTONE_TEST_LOCK_DIR"  // where the marker file lives
	lockHelperRound = "LODESTONE_TEST_LOCK_ROUNDS"
	lockKey         = "locks/job"
	lockCounter     = "locks/counter"
)

// TestLockHelperProcess is not a test: it is the body of a helper process
// and skips unless lockHelperMode is set.
//
//	count: take the lock ROUNDS times; inside, create the marker file
//	  exclusively (failing if another holder has it), increment the counter
//	  key with a plain read-then-put (a lost update shows overlap), remove
//	  the marker, unlock.
//	hold: take the lock, print "LOCKED", and keep renewing until killed.
func TestLockHelperProcess(t *testing.T) {
	mode := os.Getenv(lockHelperMode)
	if mode == "" {
		t.Skip("helper process for the cross-process lock tests")
	}
	// NB: the helper's verdict is its exit code; exiting here skips the
	// leak check, which would trip on the client's background renewals
	// and lock monitors that this process never needs to wind down.
	defer func() {
		code := 0
		if t.Failed() {
			code = 1
		}
		os.Exit(code)
	}()
	cfg := consul.DefaultConfig()
	cfg.Address = os.Getenv(lockHelperAddr)
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	cfg.HttpClient = &http.Client{Transport: tr}
	cl, err := consul.NewClient(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lock, err := cl.LockOpts(&consul.LockOptions{Key: lockKey, SessionTTL: "10s", LockDelay: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if mode == "hold" {
		if _, err := lock.Lock(nil); err != nil {
			t.Fatal(err)
		}
		fmt.Println("LOCKED")
		select {} // renewing in the background until killed
	}
	rounds, _ := strconv.Atoi(os.Getenv(lockHelperRound))
	marker := filepath.Join(os.Getenv(lockHelperDir), "held")
	kv := cl.KV()
	// retry rides out what Consul's clients retry too (a 500 such as "No
	// cluster leader" when a loaded test cluster misses a read deadline).
	retry := func(what string, op func() error) {
		t.Helper()
		for attempt := 0; ; attempt++ {
			err := op()
			if err == nil {
				return
			}
			if !consul.IsRetryableError(err) || attempt == 50 {
				t.Fatalf("%s: %v", what, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	for i := 0; i < rounds; i++ {
		retry(fmt.Sprintf("round %d: lock", i), func() error {
			_, err := lock.Lock(nil)
			return err
		})
		f, err := os.OpenFile(marker, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			t.Fatalf("round %d: mutual exclusion violated: %v", i, err)
		}
		f.Close()
		var pair *consul.KVPair
		retry("read counter", func() (err error) {
			pair, _, err = kv.Get(lockCounter, nil)
			return err
		})
		n := 0
		if pair != nil {
			n, _ = strconv.Atoi(string(pair.Value))
		}
		// NB: a plain put, retried: it sets an absolute value, so a retry
		// of a write that did apply changes nothing.
		retry("write counter", func() error {
			_, err := kv.Put(&consul.KVPair{Key: lockCounter, Value: []byte(strconv.Itoa(n + 1))}, nil)
			return err
		})
		if err := os.Remove(marker); err != nil {
			t.Fatal(err)
		}
		if err := lock.Unlock(); err != nil {
			// The lock's session is destroyed (or expires) anyway, which
			// releases the key; the next round waits for that.
			t.Logf("round %d: unlock: %v", i, err)
		}
	}
}

func lockHelper(t *testing.T, mode, addr, dir string, rounds int) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLockHelperProcess$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), lockHelperMode+"="+mode, lockHelperAddr+"="+addr, lockHelperDir+"="+dir,
		lockHelperRound+"="+strconv.Itoa(rounds))
	return cmd
}

// api.Lock gives mutual exclusion across processes: three processes, each
// connected to a different member, take one lock in turns; the counter
// they increment without CAS ends exact and no two ever held the marker.
func TestConsulLockMutualExclusionAcrossProcesses(t *testing.T) {
	c := newTestCluster(t, 3)
	dir := t.TempDir()
	const procs, rounds = 3, 6
	var cmds []*exec.Cmd
	outs := make([]*strings.Builder, procs)
	for i, name := range c.names {
		cmd := lockHelper(t, "count", c.servers[name].HTTPAddr(), dir, rounds)
		outs[i] = &strings.Builder{}
		cmd.Stdout, cmd.Stderr = outs[i], outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds = append(cmds, cmd)
	}
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Errorf("helper %d: %v\n%s", i, err, outs[i])
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	cl := consulClient(t, c, c.names[0])
	pair, _, err := cl.KV().Get(lockCounter, &consul.QueryOptions{RequireConsistent: true})
	if err != nil || pair == nil {
		t.Fatalf("counter: %v %v", pair, err)
	}
	if got, want := string(pair.Value), strconv.Itoa(procs*rounds); got != want {
		t.Fatalf("counter %s after %s locked increments: a lost update means two holders overlapped", got, want)
	}
	if pair, _, _ := cl.KV().Get(lockKey, nil); pair == nil || pair.Session != "" {
		t.Fatalf("lock key after every holder unlocked: %+v", pair)
	}
}

// A holder that stops renewing (kill -9) loses the lock by TTL, and a
// leader change in between re-arms the timers erring long: the lock is
// freed no sooner than TTL × 2 after the new leader took over, and then
// another process can take it.
func TestConsulLockFreedByTTLAcrossLeaderChange(t *testing.T) {
	c := newTestCluster(t, 3)
	lead := c.waitLeader()
	follower := c.follower()
	cmd := lockHelper(t, "hold", c.servers[follower].HTTPAddr(), t.TempDir(), 0)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	sc := bufio.NewScanner(stdout)
	for sc.Scan() && sc.Text() != "LOCKED" {
	}
	if sc.Text() != "LOCKED" {
		t.Fatalf("helper did not take the lock: %v", sc.Err())
	}
	cl := consulClient(t, c, follower)
	pair, _, err := cl.KV().Get(lockKey, nil)
	if err != nil || pair == nil || pair.Session == "" {
		t.Fatalf("lock key while held: %+v %v", pair, err)
	}
	holder := pair.Session

	// The holder stops renewing.
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	killed := time.Now()
	// A few seconds later, leadership moves: the old leader's timer would
	// have fired by the last renewal + 20s; the new one must wait a full
	// 20s from its own start.
	time.Sleep(3 * time.Second) // the gap between kill and transfer is the point here, not a wait for state
	to := ""
	for _, n := range c.names {
		if n != lead {
			to = n
			break
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.servers[lead].raft.TransferLeader(ctx, c.servers[to].ID()); err != nil {
		t.Fatalf("transfer leadership to %s: %v", to, err)
	}
	changed := time.Now()

	var freed time.Time
	for deadline := time.Now().Add(45 * time.Second); time.Now().Before(deadline); {
		p, meta, err := cl.KV().Get(lockKey, &consul.QueryOptions{WaitIndex: pair.ModifyIndex, WaitTime: 5 * time.Second})
		if consul.IsRetryableError(err) {
			continue // a read that missed its deadline during the election
		}
		if err != nil {
			t.Fatal(err)
		}
		if p != nil && p.Session == "" {
			freed = time.Now()
			break
		}
		pair.ModifyIndex = meta.LastIndex
	}
	if freed.IsZero() {
		t.Fatalf("lock still held by %s 45s after its holder died", holder)
	}
	ttlGrace := 20 * time.Second // TTL 10s × store.SessionTTLMultiplier
	if early := freed.Sub(changed); early < ttlGrace-time.Second {
		t.Fatalf("lock freed %v after the leader change (%v after the kill); the new leader must give a full %v", early, freed.Sub(killed), ttlGrace)
	}
	if info, _, err := cl.Session().Info(holder, nil); err != nil || info != nil {
		t.Fatalf("expired session still exists: %+v %v", info, err)
	}
	// NB: the new leader counts the invalidation once its own apply
	// returns, which may come after the follower above served the freed
	// lock.
	waitFor(t, 5*time.Second, func() bool {
		return gauge(t, c.servers[to], "lodestone_sessions_invalidated_total") == 1
	})

	// Another holder can take it now (its lock delay is 1ms).
	lock, err := cl.LockOpts(&consul.LockOptions{Key: lockKey, SessionTTL: "10s", LockTryOnce: true, LockWaitTime: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	lost, err := lock.Lock(nil)
	if err != nil || lost == nil {
		t.Fatalf("take the freed lock: %v (nil channel: not acquired)", err)
	}
	if err := lock.Unlock(); err != nil {
		t.Fatal(err)
	}
	if err := lock.Destroy(); err != nil && !errors.Is(err, consul.ErrLockInUse) {
		t.Fatal(err)
	}
}

// Sessions through the official client: create, info, list, renew,
// acquire/release with contention, txn lock verbs, destroy.
func TestConsulSessionsAndKVLocks(t *testing.T) {
	c := newTestCluster(t, 1)
	cl := consulClient(t, c, c.waitLeader())
	s := cl.Session()
	id1, _, err := s.Create(&consul.SessionEntry{Name: "one", TTL: "15s", LockDelay: time.Millisecond}, nil)
	if err != nil {
		t.Fatal(err)
	}
	id2, _, err := s.Create(&consul.SessionEntry{Name: "two", Behavior: consul.SessionBehaviorDelete}, nil)
	if err != nil {
		t.Fatal(err)
	}
	info, _, err := s.Info(id1, nil)
	if err != nil || info == nil || info.Name != "one" || info.TTL != "15s" || info.LockDelay != time.Millisecond || info.Behavior != "release" {
		t.Fatalf("info: %+v %v", info, err)
	}
	if list, _, err := s.List(nil); err != nil || len(list) != 2 {
		t.Fatalf("list: %d %v", len(list), err)
	}
	if list, _, err := s.Node(info.Node, nil); err != nil || len(list) != 2 {
		t.Fatalf("node sessions: %d %v", len(list), err)
	}
	if e, _, err := s.Renew(id1, nil); err != nil || e == nil || e.ID != id1 {
		t.Fatalf("renew: %+v %v", e, err)
	}

	kv := cl.KV()
	ok, _, err := kv.Acquire(&consul.KVPair{Key: "leader", Value: []byte("one"), Session: id1}, nil)
	if err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	if ok, _, err := kv.Acquire(&consul.KVPair{Key: "leader", Value: []byte("two"), Session: id2}, nil); err != nil || ok {
		t.Fatalf("a second session acquired a held key: %v %v", ok, err)
	}
	p, _, err := kv.Get("leader", nil)
	if err != nil || p.Session != id1 || p.LockIndex != 1 || string(p.Value) != "one" {
		t.Fatalf("held key: %+v %v", p, err)
	}
	if ok, _, err := kv.Release(&consul.KVPair{Key: "leader", Session: id1}, nil); err != nil || !ok {
		t.Fatalf("release: %v %v", ok, err)
	}
	ok, resp, _, err := kv.Txn(consul.KVTxnOps{
		{Verb: consul.KVLock, Key: "leader", Value: []byte("two"), Session: id2},
		{Verb: consul.KVCheckSession, Key: "leader", Session: id2},
	}, nil)
	if err != nil || !ok {
		t.Fatalf("txn lock: %v %v %+v", ok, err, resp)
	}
	// Destroying session two applies its delete behavior to the key.
	if _, err := s.Destroy(id2, nil); err != nil {
		t.Fatal(err)
	}
	if p, _, err := kv.Get("leader", nil); err != nil || p != nil {
		t.Fatalf("key of a destroyed delete-behavior session: %+v %v", p, err)
	}
	if e, _, err := s.Renew(id2, nil); err != nil || e != nil {
		t.Fatalf("renew a destroyed session: %+v %v, want nil nil (404)", e, err)
	}
}
