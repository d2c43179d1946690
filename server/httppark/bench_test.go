package httppark_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/lodestone-kv/lodestone/server/httppark"
	"github.com/lodestone-kv/lodestone/watch"
)

// BenchmarkParkCycle is one blocking query's round on a keep-alive
// connection: the lot reads it, parks it, an event wakes it, and it is
// answered. Client and server share the process, so the figures are the
// whole round's; the Consul handlers and Raft are not in it.
func BenchmarkParkCycle(b *testing.B) {
	r := newRigWith(b, httppark.Config{SweepInterval: time.Hour, NextRequestWait: time.Minute})
	c, err := net.Dial("tcp", r.addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	br := bufio.NewReader(c)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := fmt.Fprintf(c, "GET /cycle?after=%d HTTP/1.1\r\nHost: x\r\n\r\n", r.index.Load()); err != nil {
			b.Fatal(err)
		}
		<-r.parkedC
		r.publish("k", false)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			b.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("cycle %d: %s", i, resp.Status)
		}
	}
}

// cycle parks until the key changes after ?after.
func (r *rig) cycle(w http.ResponseWriter, req *http.Request) {
	var after uint64
	fmt.Sscan(req.URL.Query().Get("after"), &after)
	changed := func() bool { return r.index.Load() > after }
	if httppark.WaitOver(req.Context()) || changed() {
		w.Header().Set("X-Consul-Index", fmt.Sprint(r.index.Load()))
		w.Write([]byte(`[{"Key":"k","Value":"dmFsdWU="}]`))
		return
	}
	ok, err := r.lot.Park(w, req, httppark.Wait{Watch: watch.Request{Key: "k", StartIndex: after},
		Changed: changed, Deadline: time.Now().Add(time.Minute)})
	if err != nil || !ok {
		http.Error(w, fmt.Sprint("not parked: ", err), http.StatusInternalServerError)
		return
	}
	r.parkedC <- struct{}{}
}
