package main

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"strconv"
	"strings"

	"github.com/lodestone-kv/lodestone/internal/cpuset"
)

// coreTimes returns the busy and total time (in clock ticks, from
// /proc/stat) of the CPUs in list, a taskset-style CPU list. It tells how
// busy the load generator's core was: when it is saturated, it and not
// the proxy bounds requests/s.
func coreTimes(list string) (busy, total uint64, err error) {
	set, err := cpuset.Parse(list)
	if err != nil {
		return 0, 0, err
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0, err
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		cpu, err := strconv.Atoi(f[0][3:])
		if err != nil || !set.IsSet(cpu) {
			continue
		}
		// user nice system idle iowait irq softirq steal (guest time is
		// already in user and nice).
		var v [8]uint64
		for i := range v {
			if v[i], err = strconv.ParseUint(f[i+1], 10, 64); err != nil {
				return 0, 0, err
			}
		}
		t := v[0] + v[1] + v[2] + v[3] + v[4] + v[5] + v[6] + v[7]
		total += t
		busy += t - v[3] - v[4]
	}
	return busy, total, sc.Err()
}

// tcpActiveOpens returns the machine's count of TCP connections opened
// (connect calls: the Tcp ActiveOpens of /proc/net/snmp). With keep-alive
// clients, what it grows by is the proxy's dials to origins.
func tcpActiveOpens() (uint64, error) {
	b, err := os.ReadFile("/proc/net/snmp")
	if err != nil {
		return 0, err
	}
	var names []string
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) == 0 || f[0] != "Tcp:" {
			continue
		}
		if names == nil {
			names = f
			continue
		}
		for i, n := range names {
			if n == "ActiveOpens" && i < len(f) {
				return strconv.ParseUint(f[i], 10, 64)
			}
		}
	}
	return 0, errors.New("no Tcp ActiveOpens in /proc/net/snmp")
}
