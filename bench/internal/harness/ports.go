package harness

import (
	"fmt"
	"net"
)

// FreePorts returns n distinct TCP ports on 127.0.0.1 that were free a
// moment ago. All n listeners are held open until every port is chosen, so
// the ports are distinct; another process may still take one before the
// caller binds it, which for a benchmark on a quiet machine is acceptable.
func FreePorts(n int) ([]int, error) {
	ls := make([]net.Listener, 0, n)
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("pick free port: %w", err)
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}
