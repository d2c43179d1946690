package main

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/miekg/dns"
)

// ednsSize is the EDNS0 buffer the questions advertise: dig's default,
// and enough for every answer here, so neither server truncates.
const ednsSize = 1232

// questions are the packed questions the clients cycle through: each
// service's A and SRV. A question's first two bytes are its id, which
// each client rewrites.
func questions(services int) [][]byte {
	var out [][]byte
	for s := range services {
		for _, qtype := range []uint16{dns.TypeA, dns.TypeSRV} {
			m := new(dns.Msg).SetQuestion(fmt.Sprintf("svc%d.service.consul.", s), qtype)
			m.SetEdns0(ednsSize, false)
			m.RecursionDesired = false
			b, err := m.Pack()
			if err != nil {
				panic(err) // NB: a fixed, valid question
			}
			out = append(out, b)
		}
	}
	return out
}

// loadResult is what one measured window saw.
type loadResult struct {
	window    time.Duration
	latencies []time.Duration // answered in the window, ascending
	errors    int             // wrong answers and timeouts in the window
	firstErr  error
}

func (r loadResult) qps() float64 { return float64(len(r.latencies)) / r.window.Seconds() }

// answerTimeout is how long a client waits for an answer before it counts
// an error and asks again: far above any answer's latency here, so it
// only fires on a lost datagram.
const answerTimeout = time.Second

// drive runs clients closed-loop UDP clients against addr, each with its
// own socket, sending the questions round-robin (client c starts at c)
// for warmup then dur. An answer counts when it arrives inside the window
// and is right: its id, a response, NOERROR, not truncated, and want
// answers. Latency is from send to receipt.
func drive(ctx context.Context, addr string, clients int, warmup, dur time.Duration, qs [][]byte, want int) (loadResult, error) {
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return loadResult{}, err
	}
	conns := make([]*net.UDPConn, clients)
	for i := range conns {
		if conns[i], err = net.DialUDP("udp", nil, raddr); err != nil {
			for _, c := range conns[:i] {
				c.Close()
			}
			return loadResult{}, err
		}
	}
	start := time.Now()
	from, end := start.Add(warmup), start.Add(warmup+dur)
	type result struct {
		lat      []time.Duration
		errors   int
		firstErr error
	}
	results := make([]result, clients)
	var wg sync.WaitGroup
	for c, conn := range conns {
		wg.Go(func() {
			defer conn.Close()
			r := &results[c]
			r.lat = make([]time.Duration, 0, 1<<16)
			q := make([]byte, 512)
			buf := make([]byte, 4096)
			id := uint16(c << 10)
			for seq := c; ctx.Err() == nil; seq++ {
				wire := qs[seq%len(qs)]
				n := copy(q, wire)
				id++
				binary.BigEndian.PutUint16(q, id)
				t0 := time.Now()
				if !t0.Before(end) {
					return
				}
				err := exchange(conn, q[:n], buf, id, t0.Add(answerTimeout), want)
				t1 := time.Now()
				if err != nil && r.firstErr == nil {
					r.firstErr = err
				}
				if t1.Before(from) || t1.After(end) {
					continue
				}
				if err != nil {
					r.errors++
				} else {
					r.lat = append(r.lat, t1.Sub(t0))
				}
			}
		})
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return loadResult{}, err
	}
	out := loadResult{window: dur}
	for _, r := range results {
		out.latencies = append(out.latencies, r.lat...)
		out.errors += r.errors
		if out.firstErr == nil {
			out.firstErr = r.firstErr
		}
	}
	slices.Sort(out.latencies)
	return out, nil
}

// exchange sends q and reads until the answer with id arrives (an older
// answer, to a question that timed out, is skipped), then checks it.
func exchange(conn *net.UDPConn, q, buf []byte, id uint16, deadline time.Time, want int) error {
	if _, err := conn.Write(q); err != nil {
		return err
	}
	if err := conn.SetReadDeadline(deadline); err != nil {
		return err
	}
	for {
		n, err := conn.Read(buf)
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return errors.New("no answer within " + answerTimeout.String())
			}
			return err
		}
		if n < 12 || binary.BigEndian.Uint16(buf) != id {
			continue
		}
		flags := binary.BigEndian.Uint16(buf[2:])
		switch {
		case flags&(1<<15) == 0:
			return errors.New("answer is not a response")
		case flags&0xf != dns.RcodeSuccess:
			return fmt.Errorf("answer rcode %s", dns.RcodeToString[int(flags&0xf)])
		case flags&(1<<9) != 0:
			return errors.New("answer truncated")
		}
		if got := int(binary.BigEndian.Uint16(buf[6:])); got != want {
			return fmt.Errorf("answer has %d records, want %d", got, want)
		}
		return nil
	}
}
