package main

import (
	"encoding/base64"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// kvAnswer is a get's answer as Consul and Lodestone write it.
func kvAnswer(key string, value []byte) []byte {
	return fmt.Appendf(nil, `[{"LockIndex":0,"Key":%q,"Flags":0,"Value":%q,"CreateIndex":12,"ModifyIndex":13}]`+"\n",
		key, base64.StdEncoding.EncodeToString(value))
}

// The scan and the full decode accept and refuse the same answers.
func TestCheckGetAnswer(t *testing.T) {
	key := getKey(42)
	value := make([]byte, 256)
	ok := kvAnswer(key, value)
	for name, check := range map[string]func([]byte, int) error{
		"scan": func(b []byte, size int) error { _, err := checkGetAnswer(nil, key, b, size); return err },
		"json": func(b []byte, size int) error { return checkGetJSON(key, b, size) },
	} {
		if err := check(ok, 256); err != nil {
			t.Errorf("%s: a right answer: %v", name, err)
		}
		for what, bad := range map[string][]byte{
			"other key":    kvAnswer(getKey(43), value),
			"key prefix":   kvAnswer(key+"0", value),
			"short value":  kvAnswer(key, value[:255]),
			"two entries":  []byte(strings.Replace(string(ok), "}]", "},"+strings.TrimPrefix(strings.TrimSpace(string(ok)), "["), 1)),
			"empty array":  []byte("[]"),
			"not base64":   []byte(strings.Replace(string(ok), `"Value":"`, `"Value":"!`, 1)),
			"null value":   kvAnswer(key, nil),
			"not an array": []byte(strings.TrimSuffix(strings.TrimPrefix(strings.TrimSpace(string(ok)), "["), "]")),
		} {
			if err := check(bad, 256); !errors.Is(err, errWrongAnswer) {
				t.Errorf("%s: %s: %v, want errWrongAnswer", name, what, err)
			}
		}
	}
}
