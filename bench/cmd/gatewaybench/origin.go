package main

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// The origin every system proxies to: a minimal HTTP/1.1 keep-alive
// responder answering every request with a fixed body, of bigBody bytes
// on /64k and of -body bytes on any other path, and closing the
// connection after a request that says "Connection: close". It shares
// the load generator's core with wrk, so it is as lean as the platform
// allows (origin_epoll.go on Linux): whatever it spends per request is
// taken from wrk, and once that core saturates, requests/s measures the
// load generator instead of the proxies.

// originResponses returns the keep-alive and the closing response with a
// body of size bytes.
func originResponses(size int) [2][]byte {
	body := strings.Repeat("x", size)
	return [2][]byte{
		[]byte(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n\r\n%s", size, body)),
		[]byte(fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", size, body)),
	}
}

// originRequest is what the origin needs of one request's header.
type originRequest struct {
	size    int  // bytes of the header, with the empty lines before it
	big     bool // the target starts with /64k
	body    int  // Content-Length: body bytes to skip
	closing bool // Connection: close
}

var (
	crlf     = []byte("\r\n")
	crlfcrlf = []byte("\r\n\r\n")
)

// parseOriginRequest parses the request header at the start of b (CRLF
// line ends, as every client and proxy here sends); ok is false while it
// is not all there.
func parseOriginRequest(b []byte) (req originRequest, ok bool) {
	skip := 0
	for bytes.HasPrefix(b[skip:], crlf) {
		skip += 2 // stray CRLF between requests
	}
	end := bytes.Index(b[skip:], crlfcrlf)
	if end < 0 {
		return req, false
	}
	req.size = skip + end + len(crlfcrlf)
	line, rest, _ := bytes.Cut(b[skip:skip+end+2], crlf)
	if _, target, found := bytes.Cut(line, []byte(" ")); found && bytes.HasPrefix(target, []byte("/64k")) {
		req.big = true
	}
	for len(rest) > 0 {
		line, rest, _ = bytes.Cut(rest, crlf)
		name, value, found := bytes.Cut(line, []byte(":"))
		if !found {
			continue
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("Content-Length")):
			req.body, _ = strconv.Atoi(string(value))
		case bytes.EqualFold(name, []byte("Connection")) && bytes.EqualFold(value, []byte("close")):
			req.closing = true
		}
	}
	return req, true
}

// originResponse returns the response to req.
func originResponse(req originRequest, small, big *[2][]byte) []byte {
	resp := small
	if req.big {
		resp = big
	}
	if req.closing {
		return resp[1]
	}
	return resp[0]
}

// originStream is the parse state of one connection's input buffer:
// in[r:w] is read and not parsed, and skip request body bytes are still
// to discard. Both origin loops (origin_net.go, origin_epoll.go) use it.
type originStream struct {
	r, w, skip int
}

// room makes space at the end of in for the next read, moving what is
// unparsed to the front; false when a header fills the whole buffer.
func (s *originStream) room(in []byte) bool {
	if s.r == s.w {
		s.r, s.w = 0, 0
	} else if s.w == len(in) {
		s.w = copy(in, in[s.r:s.w])
		s.r = 0
	}
	return s.w < len(in)
}

// next consumes the next whole request in in[s.r:s.w] and returns its
// response, and whether it asked to close; ok is false while none is
// whole yet.
func (s *originStream) next(in []byte, small, big *[2][]byte) (resp []byte, closing, ok bool) {
	d := min(s.skip, s.w-s.r)
	s.r, s.skip = s.r+d, s.skip-d
	if s.skip > 0 {
		return nil, false, false
	}
	req, ok := parseOriginRequest(in[s.r:s.w])
	if !ok {
		return nil, false, false
	}
	s.r += req.size
	s.skip = req.body
	return originResponse(req, small, big), req.closing, true
}
