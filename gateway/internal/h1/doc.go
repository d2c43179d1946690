// Package h1 is the gateway's HTTP/1.1 wire: the client connections of
// its proxy listener, and its keep-alive exchanges with HTTP/1.1 origins,
// for the requests that need nothing net/http's server or http.Transport
// add: no body, no upgrade. It parses and writes HTTP/1.1 messages with
// one goroutine per connection, reused buffers and headers, and raw
// socket syscalls on Linux (connio.go); whatever it does not parse
// plainly it leaves to net/http, whose answer is then the one a client or
// origin gets.
//
// It refuses to know routes, origins, pools, balancing, retries or
// admission: a Server calls a Handler, an exchange runs on the Conn it is
// given. Those belong to the gateway.
//
// # Server: the client side
//
// A Server accepts from its listener and serves each connection on one
// goroutine: read a request header, call the Handler with a reused
// *ResponseWriter and *http.Request, write the response, read the next
// (pipelined requests are served in order). That goroutine then waits up
// to WorkerIdle to be handed the next accepted connection, so a new
// connection finds a goroutine whose stack has already grown to what
// serving takes. It serves a request only if
// its header fits the connection's read buffer (bufSize) and it is
// HTTP/1.1, origin-form, with CRLF line ends, exactly one valid Host,
// valid field names and values without obs-fold, no body (no
// Content-Length other than 0, no Transfer-Encoding), no Upgrade and no
// Expect. The first request that is anything else hands the connection,
// with the bytes read of it, to the net/http server serving HandedOff,
// for good: a malformed request line gets net/http's 400, a chunked body
// net/http's reading, a WebSocket handshake the handler's hijack.
//
// Timeouts are read deadlines: ReadHeaderTimeout for a connection's
// first header and for the rest of a header once it began, IdleTimeout
// between requests; they may end late by up to deadlineSlack. A request
// context ends when the client closes its connection while the request
// runs (noticed within two watchDelay periods; a connection with a
// pipelined request waiting is not watched), or on Close.
//
// # Conn: the origin side
//
// A Conn is one keep-alive connection to an origin. Exchange writes a
// bodiless request (the end-to-end fields as received, X-Forwarded-For,
// -Proto and -Host, Te: trailers when asked) and reads the response
// header. A plain response (HTTP/1.1, a final status, one Content-Length,
// not to HEAD) is parsed into the Conn's reused Response; any other
// (chunked, close-delimited, 204, 304, HEAD, odd framing) is read by
// http.ReadResponse. Failures: the request context's error when it
// ended, ErrHeaderTimeout, ErrStaleConn (the connection died before any
// of the response came: safe to resend on a fresh one), ErrIdleTimeout
// from a body read, or the connection's error.
//
// # Caller's duties
//
//  1. Server: serve an http.Server (same timeouts, a handler that does
//     the same) on HandedOff, and Serve; Shutdown, then shut that server
//     down; Close if Shutdown's context ended first.
//  2. Handler: use the *ResponseWriter's Hook to abort an exchange when
//     the client goes away (ClientHook.Attach, then Detach when the
//     exchange ends), and keep nothing of the request after returning.
//  3. Conn: one exchange at a time, from Exchange to its Body's Finish;
//     reuse the Conn only if Finish said so and nothing may have aborted
//     it (ClientHook.Detach true); otherwise close it.
//  4. Upgrades: IsUpgrade tells them; Hijack, Switch and Splice pass
//     bytes through once the origin answered 101.
package h1
