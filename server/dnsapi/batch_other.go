//go:build !linux

package dnsapi

var newBatchConn = newSingleConn
