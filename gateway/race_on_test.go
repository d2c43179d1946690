//go:build race

package gateway_test

// raceEnabled: the race detector slows everything 5–10×; tests that drive
// a fixed workload rate loosen their checks of the achieved rate.
const raceEnabled = true
