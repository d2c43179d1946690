package server

// Version is the server's version string, set at build time.
var Version = "dev"
