package h1

import (
	"bytes"
	"net/http"
	"net/textproto"
	"net/url"
	"strings"

	"golang.org/x/net/http/httpguts"
)

// The header parsers of both sides. They take only what they can parse
// the way net/http would and report anything else as not theirs; the
// caller then leaves the request to net/http's server, or the response
// to http.ReadResponse, so that odd messages and their errors behave
// exactly as net/http makes them.

// headerEnd returns the length of the header in b up to and including its
// empty line (-1: not all there yet), and whether a line ends in a bare LF.
func headerEnd(b []byte) (int, bool) {
	for pos := 0; ; {
		i := bytes.IndexByte(b[pos:], '\n')
		if i < 0 {
			return -1, false
		}
		if i == 0 || b[pos+i-1] != '\r' {
			return -1, true
		}
		if i == 1 {
			return pos + 2, false
		}
		pos += i + 1
	}
}

// parse fills c.req from a whole header block (request line, header
// lines, empty line; CRLF line ends). It reports false for anything the
// Server leaves to net/http: not HTTP/1.1, not origin-form, a body
// (Content-Length other than 0, any Transfer-Encoding), Upgrade, Expect,
// an invalid name or value, obs-fold, no Host or more than one.
func (c *conn) parse(b []byte) bool {
	if len(b) < 16 || b[0] == '\r' {
		return false
	}
	s := string(b) // NB: the one allocation; every string below is a substring
	line, rest, _ := strings.Cut(s, "\r\n")
	method, line, ok1 := strings.Cut(line, " ")
	target, proto, ok2 := strings.Cut(line, " ")
	if !ok1 || !ok2 || proto != "HTTP/1.1" || !validMethod(method) || len(target) == 0 || target[0] != '/' {
		return false
	}
	r := c.req
	h := r.Header
	if len(h) > 0 {
		clear(h) // NB: clear costs even on an empty map once it had entries
	}
	var vals []string // made at the first field kept in h (Host is not)
	nv := 0
	host, hosts := "", 0
	r.Close = false
	for {
		var k, value string
		var end, ok bool
		if k, value, rest, end, ok = nextHeaderLine(rest); end {
			break
		} else if !ok {
			return false // also obs-fold: a line starting with a space
		}
		switch k {
		case "Host":
			host, hosts = value, hosts+1
			continue
		case "Content-Length":
			if value != "0" || h["Content-Length"] != nil {
				return false
			}
		case "Transfer-Encoding", "Upgrade", "Expect":
			return false
		case "Connection":
			if hasToken(value, "close") {
				r.Close = true
			}
		}
		if vals == nil {
			vals = make([]string, strings.Count(rest, "\n")+1)
		}
		if nv == len(vals) {
			return false // cannot happen: one value per line
		}
		vals[nv] = value
		if vv := h[k]; vv != nil {
			h[k] = append(vv, value)
		} else {
			h[k] = vals[nv : nv+1 : nv+1]
		}
		nv++
	}
	if hosts != 1 || !httpguts.ValidHostHeader(host) {
		return false
	}
	// As net/http does for HTTP/1.0 caches.
	if pragma := h["Pragma"]; len(pragma) > 0 && pragma[0] == "no-cache" && h["Cache-Control"] == nil {
		h["Cache-Control"] = []string{"no-cache"}
	}
	if !c.setURL(target) {
		return false
	}
	r.Method = method
	r.RequestURI = target
	r.Host = host
	r.Proto, r.ProtoMajor, r.ProtoMinor = "HTTP/1.1", 1, 1
	r.ContentLength = 0
	r.Body = http.NoBody
	return true
}

// setURL sets c.req.URL for an origin-form target, as url.ParseRequestURI
// would, without allocating for the plain ones.
func (c *conn) setURL(target string) bool {
	path, query, hasQuery := strings.Cut(target, "?")
	plain := true
	for i := 0; i < len(path); i++ {
		if !plainPathByte(path[i]) {
			plain = false
			break
		}
	}
	for i := 0; i < len(query); i++ {
		if ch := query[i]; ch <= ' ' || ch == 0x7f || ch == '#' {
			plain = false
			break
		}
	}
	if plain {
		c.url = url.URL{Path: path, RawQuery: query, ForceQuery: hasQuery && query == ""}
		c.req.URL = &c.url
		return true
	}
	u, err := url.ParseRequestURI(target)
	if err != nil {
		return false
	}
	c.req.URL = u
	return true
}

// plainPathByte reports bytes url.URL writes back as they are in a path
// (unreserved, '/', and the reserved bytes it leaves unescaped there), so
// that a path of only these has no RawPath. NB: not all of RFC 3986's
// sub-delims: url.URL escapes '!', the apostrophe, '(', ')' and '*', and a URL
// without the RawPath net/http would have set sends them escaped.
func plainPathByte(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	switch c {
	case '-', '.', '_', '~', '$', '&', '+', ',', ';', '=', ':', '@', '/':
		return true
	}
	return false
}

func validMethod(m string) bool {
	if m == "" {
		return false
	}
	for i := 0; i < len(m); i++ {
		if !httpguts.IsTokenRune(rune(m[i])) {
			return false
		}
	}
	return true
}

// nextHeaderLine takes one CRLF-terminated header line off rest and
// returns its canonical name and trimmed value; end reports the blank line
// that ends the header, !ok a line that is not a valid field (the caller
// then leaves the message to net/http). Shared by the request and
// response parsers.
func nextHeaderLine(rest string) (key, value, tail string, end, ok bool) {
	line, tail, _ := strings.Cut(rest, "\r\n")
	if line == "" {
		return "", "", tail, true, true
	}
	name, value, found := strings.Cut(line, ":")
	if !found || !httpguts.ValidHeaderFieldName(name) {
		return "", "", tail, false, false
	}
	value = trimOWS(value)
	if !httpguts.ValidHeaderFieldValue(value) {
		return "", "", tail, false, false
	}
	return textproto.CanonicalMIMEHeaderKey(name), value, tail, false, true
}

// trimOWS trims the spaces and tabs around a header value (strings.Trim
// with a cutset builds the set on every call).
func trimOWS(v string) string {
	for len(v) > 0 && (v[0] == ' ' || v[0] == '\t') {
		v = v[1:]
	}
	for len(v) > 0 && (v[len(v)-1] == ' ' || v[len(v)-1] == '\t') {
		v = v[:len(v)-1]
	}
	return v
}

// hasToken reports whether the comma-separated list v holds token
// (case-insensitive).
func hasToken(v, token string) bool {
	for f := range strings.SplitSeq(v, ",") {
		if strings.EqualFold(strings.TrimSpace(f), token) {
			return true
		}
	}
	return false
}

// HopByHop reports whether the header field name (canonical) is
// hop-by-hop, so that a proxy must not forward it: one RFC 9110 §7.6.1
// lists, or one that connection, the message's Connection field values,
// names.
func HopByHop(name string, connection []string) bool {
	return isHop(name) || connection != nil && listedIn(connection, name)
}

// isHop reports the hop-by-hop fields RFC 9110 §7.6.1 lists.
func isHop(k string) bool {
	switch k {
	case "Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
		"Te", "Trailer", "Transfer-Encoding", "Upgrade":
		return true
	}
	return false
}

// listedIn reports whether k is named in a Connection header.
func listedIn(conn []string, k string) bool {
	for _, v := range conn {
		for f := range strings.SplitSeq(v, ",") {
			if http.CanonicalHeaderKey(strings.TrimSpace(f)) == k {
				return true
			}
		}
	}
	return false
}
