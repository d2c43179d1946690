package main

import (
	"strings"
	"testing"
)

func TestParseReadRounds(t *testing.T) {
	text := `# HELP lodestone_read_index_batch_size Linearizable reads that shared one ReadIndex round.
# TYPE lodestone_read_index_batch_size histogram
lodestone_read_index_batch_size_bucket{le="1"} 10
lodestone_read_index_batch_size_bucket{le="+Inf"} 40
lodestone_read_index_batch_size_sum 130
lodestone_read_index_batch_size_count 40
lodestone_read_index_latency_seconds_count 130
`
	rounds, reads, err := parseReadRounds(strings.NewReader(text))
	if err != nil || rounds != 40 || reads != 130 {
		t.Fatalf("parseReadRounds = %v, %v, %v; want 40, 130, nil", rounds, reads, err)
	}
	if _, _, err := parseReadRounds(strings.NewReader("lodestone_read_index_batch_size_count 4\n")); err == nil {
		t.Fatal("parseReadRounds without the sum: no error")
	}
	if _, _, err := parseReadRounds(strings.NewReader("lodestone_read_index_batch_size_sum x\nlodestone_read_index_batch_size_count 1\n")); err == nil {
		t.Fatal("parseReadRounds of a malformed value: no error")
	}
}
