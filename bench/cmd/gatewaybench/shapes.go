package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// A shape is one kind of load every proxy gets: what wrk asks for and how
// it holds its connections.
type shape struct {
	name string
	// path is the request path; the origin answers /64k with a 64 KiB
	// body and every other path with -body bytes.
	path string
	// newConn: wrk sends "Connection: close", so every request opens a
	// new TCP connection to the proxy (the proxy keeps its origin
	// connections).
	newConn bool
	// paced: the shape also runs the paced latency run (added p50/p99).
	paced bool
	// churn: the shape runs only the gateway, in slices with and without
	// registry churn (churn.go).
	churn bool
	// flat and pacedScript are the wrk scripts, written by writeScripts.
	flat, pacedScript string
}

// bigBody is the size the origin answers /64k with.
const bigBody = 64 << 10

var allShapes = []shape{
	{name: "small", path: "/", paced: true},
	{name: "64k", path: "/64k"},
	{name: "newconn", path: "/", newConn: true},
	{name: "churn", path: "/", churn: true},
}

// shapesFromFlag returns the shapes a -shapes list names, in the order
// of allShapes.
func shapesFromFlag(list string) ([]shape, error) {
	want := map[string]bool{}
	for _, s := range strings.Split(list, ",") {
		if s = strings.TrimSpace(s); s != "" {
			want[s] = true
		}
	}
	var out []shape
	for _, sh := range allShapes {
		if want[sh.name] {
			out = append(out, sh)
			delete(want, sh.name)
		}
	}
	for s := range want {
		return nil, fmt.Errorf("-shapes: unknown shape %q (small, 64k, newconn, churn)", s)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("-shapes: none given")
	}
	return out, nil
}

// bodySize is the response body size of sh.
func (sh shape) bodySize() int {
	if sh.path == "/64k" {
		return bigBody
	}
	return max(*flagBody, 1)
}

// writeScripts writes sh's wrk scripts into dir.
func (sh *shape) writeScripts(dir string, pacingMS int) error {
	var pre string
	if sh.newConn {
		pre = "wrk.headers[\"Connection\"] = \"close\"\n"
	}
	sh.flat = filepath.Join(dir, sh.name+".lua")
	if err := os.WriteFile(sh.flat, []byte(pre+wrkReport), 0o644); err != nil {
		return err
	}
	sh.pacedScript = filepath.Join(dir, sh.name+"-paced.lua")
	return os.WriteFile(sh.pacedScript, []byte(fmt.Sprintf("%sdelay = function() return %d end\n%s", pre, pacingMS, wrkReport)), 0o644)
}
