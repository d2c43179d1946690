package h1

// BufSize is the client read buffer: a header that fills it goes to
// net/http.
const BufSize = bufSize

// WatchDelay is the client-gone watch's period.
const WatchDelay = watchDelay

// RemoteAddr is how a client connection's RemoteAddr is spelled.
var RemoteAddr = remoteAddr
