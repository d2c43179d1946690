//go:build !unix

package httppark

// gone cannot peek at a socket here: parked requests whose clients went
// away are freed at their deadline.
func gone(any) bool { return false }
