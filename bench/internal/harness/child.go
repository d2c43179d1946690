package harness

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Child is a helper process driven over its stdin and stdout, one JSON
// value per line each way, started by StartChild: a load generator that
// needs a process of its own (its own CPU account, its own open-file
// limit) but answers to the benchmark.
type Child struct {
	proc *Proc
	in   *os.File // the child's stdin
	out  *os.File // the child's stdout
	dec  *json.Decoder
}

// StartChild starts bin with args, its stderr going to logPath, pinned to
// cpus when not empty (see Start).
func StartChild(name, bin string, args []string, logPath, cpus string) (*Child, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	p, err := start(name, bin, args, logPath, cpus, inR, outW)
	// The child holds its own ends now (or never will).
	inR.Close()
	outW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, err
	}
	return &Child{proc: p, in: inW, out: outR, dec: json.NewDecoder(bufio.NewReader(outR))}, nil
}

// Proc is the child process, for its pid, logs and exit status.
func (c *Child) Proc() *Proc { return c.proc }

// Send writes v to the child's stdin as one JSON line.
func (c *Child) Send(v any) error {
	if err := json.NewEncoder(c.in).Encode(v); err != nil {
		return fmt.Errorf("%s: send: %w%s", c.proc.Name, err, LogTails("", []*Proc{c.proc}, 1500))
	}
	return nil
}

// Recv reads the child's next JSON value into v. If ctx ends first the
// child is stopped, since a later answer could not be matched to its
// request.
func (c *Child) Recv(ctx context.Context, v any) error {
	done := make(chan error, 1)
	go func() { done <- c.dec.Decode(v) }()
	select {
	case err := <-done:
		if err != nil {
			return fmt.Errorf("%s: read answer: %w%s", c.proc.Name, err, LogTails("", []*Proc{c.proc}, 1500))
		}
		return nil
	case <-ctx.Done():
		err := c.Interrupt()
		<-done // the stopped child's stdout is at EOF
		return errors.Join(ctx.Err(), err)
	}
}

// Interrupt ends the child now: its stdin is closed and it is signalled
// at once (Proc.Stop), not left to finish what it was asked. It is for a
// benchmark that was itself interrupted, and safe to call twice.
func (c *Child) Interrupt() error {
	c.in.Close()
	err := c.proc.Stop(childGrace)
	c.out.Close()
	return err
}

// childGrace is how long a child may take to exit once asked, by its
// stdin's end or by SIGTERM.
const childGrace = 10 * time.Second

// Stop ends the child: its stdin is closed, so it exits once it has
// finished what it was asked; it is signalled if it has not exited within
// 10 seconds. It is safe to call twice.
func (c *Child) Stop() error {
	c.in.Close()
	var err error
	select {
	case <-c.proc.done:
		if c.proc.err != nil {
			err = fmt.Errorf("%s: %w%s", c.proc.Name, c.proc.err, LogTails("", []*Proc{c.proc}, 1500))
		}
	case <-time.After(childGrace):
		err = c.proc.Stop(childGrace)
	}
	c.out.Close()
	return err
}

// ParentLink is a child's end of StartChild's pipes: its stdin and stdout.
type ParentLink struct {
	dec *json.Decoder
	enc *json.Encoder
}

// Parent is the link to the process that started this one with
// StartChild, over in (its stdin) and out (its stdout).
func Parent(in io.Reader, out io.Writer) *ParentLink {
	return &ParentLink{dec: json.NewDecoder(bufio.NewReader(in)), enc: json.NewEncoder(out)}
}

// Recv reads the parent's next JSON value into v.
func (p *ParentLink) Recv(v any) error {
	if err := p.dec.Decode(v); err != nil {
		return fmt.Errorf("read from parent: %w", err)
	}
	return nil
}

// Send writes v to the parent as one JSON line.
func (p *ParentLink) Send(v any) error {
	if err := p.enc.Encode(v); err != nil {
		return fmt.Errorf("send to parent: %w", err)
	}
	return nil
}
