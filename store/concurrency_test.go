package store

import (
	"bytes"
	"fmt"
	"sync"
	"testing"

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
