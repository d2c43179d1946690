// Package harness holds the pieces every side-by-side benchmark under bench/
// shares: picking free loopback ports, starting and stopping server
// processes (optionally pinned with taskset), helper processes driven over
// their pipes (Child: the writer child, query processes), polling until a
// system is ready (Poll), progress lines and the machine's load (NewLogf,
// LoadAvg), driving N clients for a fixed window, turning latencies into percentiles, taking medians over
// repetitions, and printing the one-line BENCH verdict that bench/README.md
// ("How benchmarks report") defines.
//
// It knows nothing of Lodestone or any peer: a benchmark supplies the
// command lines and the operation to time.
//
// A caller's duties, in order: pick ports, Start the processes, wait for the
// system to be ready (system-specific), Drive the workload, Stop the
// processes (always, also on error or Ctrl-C), aggregate repetitions with
// Median, and print Line values last.
package harness
