package h1

import (
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"
)

// ResponseWriter is the http.ResponseWriter (and http.Flusher) a Server's
// Handler gets. It renders what net/http's server would: Date, sniffed
// Content-Type, Content-Length when the handler set it or the whole body
// fit before the handler returned, chunked otherwise (with trailers), and
// no body for HEAD, 1xx, 204 and 304. It does not hijack: upgrades never
// reach a Server's Handler. Like net/http's, it is for the handler's
// goroutine only. One difference: for HEAD it sends no Content-Length or
// sniffed Content-Type for a body the handler wrote (net/http derives
// both from a small one); a proxied HEAD answer carries the origin's.
type ResponseWriter struct {
	c           *conn
	h           http.Header
	head        bool // HEAD request
	close       bool // Connection: close after this response
	status      int
	wroteHeader bool
	committed   bool // the header is in bw
	chunked     bool
	noBody      bool
	hasCL       bool
	hasType     bool
	hasDate     bool
	trailers    []string // declared trailer keys
	hdr         []byte   // rendered status line and header fields
	pending     []byte   // body held back while the length is unknown
	err         error
	now         time.Time // a recent clock reading for Date (zero: read the clock); see SetNow
}

// pendingMax is how much body of unknown length is held back to be sent
// with a Content-Length instead of chunked (net/http holds 2 KiB).
const pendingMax = 2 << 10

func (w *ResponseWriter) reset(r *http.Request) {
	clear(w.h)
	w.head = r.Method == http.MethodHead
	w.close = r.Close
	w.status = 0
	w.wroteHeader, w.committed, w.chunked, w.noBody = false, false, false, false
	w.hasCL, w.hasType, w.hasDate = false, false, false
	w.trailers = w.trailers[:0]
	w.hdr = w.hdr[:0]
	w.pending = w.pending[:0]
	w.err = nil
	w.now = time.Time{}
}

func (w *ResponseWriter) Header() http.Header { return w.h }

func (w *ResponseWriter) WriteHeader(code int) {
	if !w.begin(code) {
		return
	}
	b := w.hdr
	for k, vv := range w.h {
		if !w.note(k, vv) || strings.HasPrefix(k, http.TrailerPrefix) || !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		for _, v := range vv {
			b = append(b, k...)
			b = append(b, ": "...)
			b = appendHeaderValue(b, v)
			b = append(b, "\r\n"...)
		}
	}
	w.hdr = b
}

// WriteHeaderFrom is WriteHeader for the response of b, an exchange
// made with ExchangeOptions.FieldsOnly whose response came with a nil
// Header: it writes the response's status and its end-to-end fields as
// the origin sent them (valid names and values), without a header map to
// fill and then walk. Header() is not consulted.
func (w *ResponseWriter) WriteHeaderFrom(b *Body) {
	if !w.begin(b.resp.StatusCode) {
		return
	}
	buf := w.hdr
	for _, f := range b.c.fields {
		vv := [1]string{f.v}
		if isHop(f.k) || !w.note(f.k, vv[:]) {
			continue
		}
		buf = append(buf, f.k...)
		buf = append(buf, ": "...)
		buf = append(buf, f.v...)
		buf = append(buf, "\r\n"...)
	}
	w.hdr = buf
}

// Hook returns the client connection's hook: attach the exchange that
// serves the request to it, so that the client's going away aborts it.
func (w *ResponseWriter) Hook() *ClientHook { return &w.c.hook }

// SetNow gives the writer a recent clock reading to use instead of
// reading the clock: for the Date header if it is not written yet, and
// as the response's end for the connection's next read deadline.
func (w *ResponseWriter) SetNow(t time.Time) { w.now = t }

// WriteWaited reports whether a write to the client connection waited
// for room in the socket's buffer (or may have) since the request began.
func (w *ResponseWriter) WriteWaited() bool { return w.c.io.writeWaited }

// begin starts the response's header with its status line; false if the
// header is written already or code is invalid.
func (w *ResponseWriter) begin(code int) bool {
	if w.wroteHeader || code < 100 || code > 999 {
		return false
	}
	w.wroteHeader = true
	w.status = code
	w.noBody = w.head || !bodyAllowed(code)
	b := append(w.hdr[:0], "HTTP/1.1 "...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, ' ')
	b = append(b, http.StatusText(code)...)
	w.hdr = append(b, "\r\n"...)
	return true
}

func bodyAllowed(code int) bool {
	return code >= 200 && code != http.StatusNoContent && code != http.StatusNotModified
}

// note records what header field k (values vv) means for the framing
// and reports whether it is written as it is.
func (w *ResponseWriter) note(k string, vv []string) bool {
	switch k {
	case "Transfer-Encoding":
		return false // the framing is ours
	case "Trailer":
		for _, v := range vv {
			for f := range strings.SplitSeq(v, ",") {
				if f = textproto.TrimString(f); f != "" {
					w.trailers = append(w.trailers, http.CanonicalHeaderKey(f))
				}
			}
		}
		return !w.noBody
	case "Content-Length":
		if !bodyAllowed(w.status) {
			return false
		}
		w.hasCL = true
	case "Content-Type":
		if w.status == http.StatusNotModified {
			return false
		}
		w.hasType = true
	case "Content-Encoding":
		w.hasType = w.hasType || len(vv) > 0 && vv[0] != "" // NB: never sniff encoded bodies
	case "Date":
		w.hasDate = true
	case "Connection":
		for _, v := range vv {
			if hasToken(v, "close") {
				w.close = true
			}
		}
		return false
	}
	return true
}

// appendHeaderValue appends v with CR and LF replaced by spaces and
// surrounding space trimmed, as net/http writes header values.
func appendHeaderValue(b []byte, v string) []byte {
	v = textproto.TrimString(v)
	if strings.ContainsAny(v, "\r\n") {
		v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
	}
	return append(b, v...)
}

func (w *ResponseWriter) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.noBody {
		if !w.head {
			return 0, http.ErrBodyNotAllowed
		}
		return len(p), nil
	}
	if !w.committed {
		if !w.hasCL && len(w.pending)+len(p) <= pendingMax && len(w.trailers) == 0 {
			w.pending = append(w.pending, p...)
			return len(p), nil
		}
		w.chunked = !w.hasCL
		if !w.chunked && len(w.pending) == 0 {
			if err := w.commitWith(p); err != nil {
				w.err = err
				return 0, err
			}
			return len(p), nil
		}
		sniff := p
		if len(w.pending) > 0 {
			sniff = w.pending
		}
		w.commit(sniff, -1)
		if len(w.pending) > 0 {
			w.writeChunk(w.pending)
			w.pending = w.pending[:0]
		}
	}
	if err := w.writeChunk(p); err != nil {
		w.err = err
		return 0, err
	}
	return len(p), nil
}

// writeChunk writes p as body bytes (a chunk when chunked; nothing for
// an empty p); the error is the connection's.
func (w *ResponseWriter) writeChunk(p []byte) error {
	bw := w.c.bw
	if len(p) == 0 {
		return nil
	}
	if !w.chunked {
		_, err := bw.Write(p)
		return err
	}
	var n [16]byte
	bw.Write(strconv.AppendInt(n[:0], int64(len(p)), 16))
	bw.WriteString("\r\n")
	bw.Write(p)
	_, err := bw.WriteString("\r\n")
	return err
}

// Flush sends what is written so far; an unknown length becomes chunked.
func (w *ResponseWriter) Flush() {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return
	}
	if !w.committed {
		w.chunked = !w.hasCL && !w.noBody
		w.commit(w.pending, -1)
		if !w.noBody {
			w.writeChunk(w.pending)
		}
		w.pending = w.pending[:0]
	}
	if err := w.c.bw.Flush(); err != nil {
		w.err = err
	}
}

// commit writes the header with its framing; sniff is the first body
// bytes (for Content-Type), cl a Content-Length to add (-1: none).
func (w *ResponseWriter) commit(sniff []byte, cl int) {
	w.render(sniff, cl)
	w.c.bw.Write(w.hdr)
}

// commitWith commits the header and writes p, the first body bytes of a
// response that is not chunked, after it. NB: when nothing else waits in
// the buffer and the two do not fit in it together, they go out in one
// write (connIO.writeTwo) instead of a buffer's worth, then the rest.
func (w *ResponseWriter) commitWith(p []byte) error {
	bw := w.c.bw
	if bw.Buffered() > 0 {
		w.commit(p, -1)
		return w.writeChunk(p)
	}
	w.render(p, -1)
	if len(w.hdr)+len(p) <= bw.Available() {
		bw.Write(w.hdr)
		_, err := bw.Write(p)
		return err
	}
	return w.c.io.writeTwo(w.hdr, p)
}

// render completes w.hdr with the framing fields and the blank line
// that ends the header, and marks the header committed.
func (w *ResponseWriter) render(sniff []byte, cl int) {
	w.committed = true
	b := w.hdr
	if !w.noBody && !w.hasType && len(sniff) > 0 {
		b = append(b, "Content-Type: "...)
		b = append(b, http.DetectContentType(sniff)...)
		b = append(b, "\r\n"...)
	}
	if !w.hasDate {
		b = append(b, "Date: "...)
		b = append(b, w.c.httpDate(w.now)...)
		b = append(b, "\r\n"...)
	}
	if cl >= 0 {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(cl), 10)
		b = append(b, "\r\n"...)
	}
	if w.chunked {
		b = append(b, "Transfer-Encoding: chunked\r\n"...)
	}
	if w.close {
		b = append(b, "Connection: close\r\n"...)
	}
	w.hdr = append(b, "\r\n"...)
}

// finish completes the response (header if not out yet, held-back body,
// the last chunk and trailers) and flushes it in one write when it fits.
func (w *ResponseWriter) finish() error {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if w.err != nil {
		return w.err
	}
	bw := w.c.bw
	if !w.committed {
		// NB: a body that fit in pending goes out with its length, as
		// net/http does; declared trailers need chunked.
		cl := -1
		if !w.hasCL && !w.noBody && len(w.trailers) == 0 {
			cl = len(w.pending)
		}
		w.chunked = cl < 0 && !w.hasCL && !w.noBody
		w.commit(w.pending, cl)
		if !w.noBody {
			w.writeChunk(w.pending)
		}
	}
	if w.chunked {
		bw.WriteString("0\r\n")
		for _, k := range w.trailers {
			for _, v := range w.h[k] {
				bw.WriteString(k)
				bw.WriteString(": ")
				bw.Write(appendHeaderValue(nil, v))
				bw.WriteString("\r\n")
			}
		}
		for k, vv := range w.h {
			if tk, ok := strings.CutPrefix(k, http.TrailerPrefix); ok {
				for _, v := range vv {
					bw.WriteString(tk)
					bw.WriteString(": ")
					bw.Write(appendHeaderValue(nil, v))
					bw.WriteString("\r\n")
				}
			}
		}
		bw.WriteString("\r\n")
	}
	if w.close {
		return w.c.io.flushLast(bw)
	}
	return bw.Flush()
}
