package harness

import (
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/lodestone-kv/lodestone/internal/cpuset"
	"golang.org/x/sys/unix"
)

// Pid returns the process id (the server itself: taskset execs it).
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// CPUTime returns the user+system CPU time the process pid has used, from
// /proc/<pid>/stat (clock ticks of 1/100 s, the Linux default USER_HZ).
func CPUTime(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	// Fields after the command name, which is in parentheses and may
	// contain spaces: state is field 3, utime 14, stime 15.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f))
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat: utime %q stime %q", pid, f[11], f[12])
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// RSS is the resident memory of process pid, in bytes.
func RSS(pid int) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
	if err != nil {
		return 0, err
	}
	// Pages: size, resident, shared, ...
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0, fmt.Errorf("parse /proc/%d/statm: %q", pid, b)
	}
	pages, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("parse /proc/%d/statm: resident %q: %w", pid, f[1], err)
	}
	return pages * int64(os.Getpagesize()), nil
}

// Pinning applies the load generator's CPU list (clientCPUs, "" = none) to
// this process and returns the sentence a benchmark prints to state how
// its servers (serverCPUs, applied by Start through taskset) and its load
// generator (named program) were pinned.
func Pinning(program, serverCPUs, clientCPUs string) (string, error) {
	servers := "every server process ran unpinned"
	if serverCPUs != "" {
		if _, err := cpuset.Parse(serverCPUs); err != nil {
			return "", fmt.Errorf("-server-cpus: %w", err)
		}
		servers = fmt.Sprintf("every server process of every system ran under the same `taskset -c %s`", serverCPUs)
	}
	client := "the load generator ran unpinned"
	if clientCPUs != "" {
		if err := cpuset.PinSelf(clientCPUs); err != nil {
			return "", fmt.Errorf("-client-cpus: %w", err)
		}
		client = fmt.Sprintf("the load generator (%s) was pinned to CPU list %s (GOMAXPROCS=%d)", program, clientCPUs, runtime.GOMAXPROCS(0))
	}
	return fmt.Sprintf("%s; %s; machine has %d CPUs", servers, client, runtime.NumCPU()), nil
}

// Moved appends to a pinning sentence (see Pinning) that what runs on the
// CPU list cpus instead, named by its flag; cpus "" leaves it as it is.
func Moved(pinning, what, flag, cpus string) (string, error) {
	if cpus == "" {
		return pinning, nil
	}
	if _, err := cpuset.Parse(cpus); err != nil {
		return "", fmt.Errorf("-%s: %w", flag, err)
	}
	return fmt.Sprintf("%s; %s ran on CPU list %s instead", pinning, what, cpus), nil
}

// CPUTicks is what /proc/stat says one CPU did since boot, in clock ticks.
type CPUTicks struct {
	Busy   uint64 // user, nice, system, irq, softirq, steal
	Kernel uint64 // system, irq, softirq: the part of Busy spent in the kernel
	All    uint64 // Busy plus idle and iowait
}

// ReadCPUTicks reads every CPU's line of /proc/stat.
func ReadCPUTicks() (map[int]CPUTicks, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	return parseCPUTicks(string(b))
}

func parseCPUTicks(stat string) (map[int]CPUTicks, error) {
	out := map[int]CPUTicks{}
	for line := range strings.Lines(stat) {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		cpu, err := strconv.Atoi(f[0][3:])
		if err != nil {
			return nil, fmt.Errorf("/proc/stat line %q: %w", f[0], err)
		}
		// user nice system idle iowait irq softirq steal (guest time is
		// counted in user already)
		var v [8]uint64
		for i := range v {
			if v[i], err = strconv.ParseUint(f[1+i], 10, 64); err != nil {
				return nil, fmt.Errorf("/proc/stat %s field %d: %w", f[0], i+1, err)
			}
		}
		kernel := v[2] + v[5] + v[6]
		busy := v[0] + v[1] + kernel + v[7]
		out[cpu] = CPUTicks{Busy: busy, Kernel: kernel, All: busy + v[3] + v[4]}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("/proc/stat: no per-CPU lines")
	}
	return out, nil
}

// CoreBusy says how busy the CPUs in set were between two readings: the
// busy share of their time, and the kernel's share, as "96%(kernel=53%)".
// A benchmark prints it to show whether the servers' cores had room left:
// one that is near 100% before the load under test arrives measures
// queueing, not the load.
func CoreBusy(before, after map[int]CPUTicks, set unix.CPUSet) string {
	var busy, kernel, all uint64
	for cpu, a := range after {
		if !set.IsSet(cpu) {
			continue
		}
		b := before[cpu]
		busy += a.Busy - b.Busy
		kernel += a.Kernel - b.Kernel
		all += a.All - b.All
	}
	if all == 0 {
		return "?"
	}
	return fmt.Sprintf("%.0f%%(kernel=%.0f%%)", 100*float64(busy)/float64(all), 100*float64(kernel)/float64(all))
}

// BusyTime is the CPU time the CPUs in set were busy between two
// readings (ticks of USER_HZ, 1/100 s, as CPUTime's): with the CPU time
// of the processes known to run there, what else did.
func BusyTime(before, after map[int]CPUTicks, set unix.CPUSet) time.Duration {
	var busy uint64
	for cpu, a := range after {
		if set.IsSet(cpu) {
			busy += a.Busy - before[cpu].Busy
		}
	}
	return time.Duration(busy) * 10 * time.Millisecond
}

// CPUsOf is the CPU set a taskset list names, every CPU for "" (no
// pinning).
func CPUsOf(list string) (unix.CPUSet, error) {
	if list != "" {
		return cpuset.Parse(list)
	}
	var set unix.CPUSet
	for cpu := range runtime.NumCPU() {
		set.Set(cpu)
	}
	return set, nil
}
