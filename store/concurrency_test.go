package store

import (
	"bytes"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
)

// TestConcurrentReadsDuringApply runs readers, and snapshot encoders, while
// one goroutine applies. Under -race it proves the locking; the readers
// also check what must hold at every instant:
//   - Index() never goes backwards for one reader;
//   - a transaction is atomic: pair/a and pair/b, always written together
//     by one txn, are never seen with different values (Range and Get);
//   - a snapshot's encoding does not change while writes go on.
func TestConcurrentReadsDuringApply(t *testing.T) {
	s := New()
	s.Apply(1, txnCmd(opSet("pair/a", "0"), opSet("pair/b", "0")))
	const writes = 1500

	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 16)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for r := 0; r < 4; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var last uint64
			for {
				select {
				case <-stop:
					return
				default:
				}
				kvs, more, idx := s.Range([]byte("pair/"), nil, 10, false)
				if idx < last {
					report(fmt.Errorf("index went back from %d to %d", last, idx))
				}
				last = idx
				if len(kvs) != 2 || more || !bytes.Equal(kvs[0].Value, kvs[1].Value) || kvs[0].ModifyIndex != kvs[1].ModifyIndex {
					report(fmt.Errorf("torn txn at %d: %v", idx, kvs))
				}
				s.Get([]byte("k/7"))
				s.Range([]byte("k/"), nil, 50, true)
				s.Members()
				s.KVIndex()
				if p, i := s.Admission(); (p == nil) != (i == 0) || (p != nil && p.Writes != i) {
					report(fmt.Errorf("admission policy %v at index %d", p, i))
				}
				if i := s.Index(); i < last {
					report(fmt.Errorf("Index went back from %d to %d", last, i))
				}
			}
		}()
	}

	snaps := make(chan *Snapshot, 4)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for sn := range snaps {
			var a, b bytes.Buffer
			if _, err := sn.WriteTo(&a); err != nil {
				report(err)
			}
			if _, err := sn.WriteTo(&b); err != nil {
				report(err)
			}
			if !bytes.Equal(a.Bytes(), b.Bytes()) {
				report(fmt.Errorf("snapshot at %d changed while writes went on", sn.Index()))
			}
			restored := New()
			if err := restored.Restore(&a); err != nil {
				report(err)
			} else if got, want := restored.Index(), sn.Index(); got != want {
				report(fmt.Errorf("restored index %d, want %d", got, want))
			}
		}
	}()

	// The apply goroutine (this one).
	for i := uint64(2); i < writes; i++ {
		v := fmt.Sprint(i)
		switch i % 5 {
		case 0:
			s.Apply(i, txnCmd(opSet("pair/a", v), opSet("k/x", v), opSet("pair/b", v)))
		case 1:
			s.Apply(i, delPrefix(fmt.Sprintf("k/%d", i%10)))
		case 2:
			s.SetMember(i, &lodestonepb.Member{Id: i%3 + 1, Name: v})
		case 3:
			s.Apply(i, admissionCmd(&lodestonepb.AdmissionPolicy{Enabled: true, Writes: i})) // Writes tells the index
		default:
			s.Apply(i, putCmd(fmt.Sprintf("k/%d", i%97), v))
		}
		if i%300 == 0 {
			snaps <- s.Snapshot()
		}
	}
	close(snaps)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	checkInvariants(t, s)
}

// TestConcurrentCatalogReadsDuringApply runs the catalog and session reads
// and snapshot encoding while one goroutine registers, updates checks,
// locks and invalidates. Under -race it proves the locking; readers also
// check that a registration is atomic: web-<n> and its check "http-<n>"
// are registered and deregistered by one command each, so a health answer
// never shows the instance without its check.
func TestConcurrentCatalogReadsDuringApply(t *testing.T) {
	s := New()
	s.Apply(1, at(t0, regNode("n1")))
	const writes = 1200
	var wg sync.WaitGroup
	stop := make(chan struct{})
	errs := make(chan error, 16)
	report := func(err error) {
		select {
		case errs <- err:
		default:
		}
	}
	for r := 0; r < 3; r++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var lastIdx uint64
			for {
				select {
				case <-stop:
					return
				default:
				}
				hs, meta := s.HealthService("web", nil, false)
				for _, h := range hs {
					if len(h.Checks) != 1 || h.Checks[0].ServiceId != h.Service.Id {
						report(fmt.Errorf("torn registration at %d: %v", meta.Applied, h))
					}
				}
				if meta.Index < lastIdx {
					report(fmt.Errorf("ServiceIndex went back from %d to %d", lastIdx, meta.Index))
				}
				lastIdx = meta.Index
				s.Services()
				s.Nodes()
				s.Node("n1")
				s.ChecksInState(ANY)
				s.Sessions()
				s.NodeSessions("n1")
				s.ExpiredSessions(time.Unix(0, t0), time.Time{})
				s.KVIndexFor([]byte("lock/"), true)
				s.ServiceIndex("web")
			}
		}()
	}
	snaps := make(chan *Snapshot, 4)
	wg.Add(1)
	go func() {
		defer wg.Done()
		for sn := range snaps {
			var a bytes.Buffer
			if _, err := sn.WriteTo(&a); err != nil {
				report(err)
			}
			if err := New().Restore(&a); err != nil {
				report(err)
			}
		}
	}()
	for i := uint64(2); i < writes; i++ {
		n := fmt.Sprint(i % 7)
		var cmd *lodestonepb.Command
		switch i % 6 {
		case 0:
			reg := regSvc("n1", "web-"+n, "web")
			reg.GetCatalogRegister().Checks = []*lodestonepb.Check{{CheckId: "http-" + n, ServiceId: "web-" + n, Status: PASSING}}
			cmd = reg
		case 1:
			cmd = dereg("n1", "web-"+n, "")
		case 2:
			cmd = sessCreate(sid(int(i%5)), "n1", withTTL(10*time.Second))
		case 3:
			cmd = acquireCmd("lock/"+n, "v", sid(int(i%5)))
		case 4:
			cmd = sessDestroy(sid(int(i % 5)))
		default:
			cmd = checkUpd("n1", "http-"+n, []lodestonepb.HealthStatus{PASSING, WARNING}[i%2], "")
		}
		s.Apply(i, at(t0+int64(i)*int64(time.Second), cmd))
		if i%200 == 0 {
			snaps <- s.Snapshot()
		}
	}
	close(snaps)
	close(stop)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	checkInvariants(t, s)
}
