package snapshot

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/lodestone-kv/lodestone/api/lodestonepb"
	"github.com/lodestone-kv/lodestone/internal/atomicfile"
	"github.com/lodestone-kv/lodestone/internal/token"
	"github.com/lodestone-kv/lodestone/tools/compact"
)

// SaveOptions configures Save.
type SaveOptions struct {
	// Endpoints are servers' gRPC addresses, tried in order until one
	// streams a whole snapshot.
	Endpoints []string
	// TLS, when set, dials them over TLS with it; nil: plain text.
	TLS *tls.Config
	// Path is the file to create. An existing file is replaced only once
	// the new one is complete and durable.
	Path string
	// Now supplies the progress bar's timestamps; nil means time.Now.
	Now func() time.Time
	// ProgressEvery is the least time between two redraws; 0 means 200ms.
	ProgressEvery time.Duration
	// Token is the ACL token's secret; with ACLs on, saving needs
	// acl:write (the snapshot holds every token).
	Token string
}

// Save streams a consistent snapshot from the first endpoint that serves
// one and writes it crash-safely to o.Path, drawing a progress bar on
// progress (nil draws none). The data's SHA-256 sent by the server is
// checked before the file is renamed into place.
func Save(ctx context.Context, o SaveOptions, progress io.Writer) (Info, error) {
	if len(o.Endpoints) == 0 {
		return Info{}, errors.New("no endpoints to take a snapshot from")
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.ProgressEvery == 0 {
		o.ProgressEvery = 200 * time.Millisecond
	}
	if fi, err := os.Stat(filepath.Dir(o.Path)); err != nil || !fi.IsDir() {
		return Info{}, fmt.Errorf("directory of %s does not exist", o.Path)
	}
	var errs []string
	for _, ep := range o.Endpoints {
		err := saveFrom(ctx, ep, o, progress)
		if err == nil {
			return Inspect(o.Path)
		}
		if ctx.Err() != nil {
			return Info{}, err
		}
		errs = append(errs, fmt.Sprintf("%s: %v", ep, err))
	}
	return Info{}, fmt.Errorf("no server streamed a snapshot (%s)", strings.Join(errs, "; "))
}

func saveFrom(ctx context.Context, ep string, o SaveOptions, progress io.Writer) error {
	creds := insecure.NewCredentials()
	if o.TLS != nil {
		creds = credentials.NewTLS(o.TLS)
	}
	conn, err := grpc.NewClient(ep, grpc.WithTransportCredentials(creds), grpc.WithPerRPCCredentials(token.PerRPC(o.Token)))
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer conn.Close()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := lodestonepb.NewAdminClient(conn).SaveSnapshot(ctx, &lodestonepb.SaveSnapshotRequest{})
	if err != nil {
		return err
	}
	first, err := stream.Recv()
	if err != nil {
		return fmt.Errorf("receive snapshot header: %w", err)
	}
	hdr := first.GetHeader()
	if hdr == nil {
		return errors.New("the server sent no snapshot header")
	}
	prefix, err := encodeHeader(hdr)
	if err != nil {
		return err
	}
	bar := compact.NewBar(progress, o.Now, o.ProgressEvery, "saving snapshot")
	total := int64(hdr.GetSize())
	ok := false
	defer func() { bar.Finish(ok) }()
	err = atomicfile.Write(o.Path, 0o600, func(w io.Writer) error {
		fileSum := sha256.New()
		dataSum := sha256.New()
		out := io.MultiWriter(w, fileSum)
		if _, err := out.Write(prefix); err != nil {
			return fmt.Errorf("write header: %w", err)
		}
		var got uint64
		for {
			chunk, err := stream.Recv()
			if errors.Is(err, io.EOF) {
				return errors.New("the stream ended before the checksum")
			}
			if err != nil {
				return fmt.Errorf("receive snapshot at byte %d of %d: %w", got, hdr.GetSize(), err)
			}
			if sum := chunk.GetSha256(); sum != nil {
				if got != hdr.GetSize() {
					return fmt.Errorf("received %d bytes of state, the header promised %d", got, hdr.GetSize())
				}
				if !bytes.Equal(sum, dataSum.Sum(nil)) {
					return errors.New("checksum mismatch: the state received is not what the server sent")
				}
				if _, err := w.Write(fileSum.Sum(nil)); err != nil {
					return fmt.Errorf("write checksum: %w", err)
				}
				return nil
			}
			d := chunk.GetData()
			if got+uint64(len(d)) > hdr.GetSize() {
				return fmt.Errorf("received more than the %d bytes of state the header promised", hdr.GetSize())
			}
			if _, err := out.Write(d); err != nil {
				return fmt.Errorf("write state: %w", err)
			}
			dataSum.Write(d)
			got += uint64(len(d))
			done := int64(got)
			bar.Update(done, total, func(elapsed time.Duration) string {
				speed := "-"
				if secs := elapsed.Seconds(); secs > 0 {
					speed = compact.HumanBytes(int64(float64(done)/secs)) + "/s"
				}
				return compact.HumanBytes(done) + "/" + compact.HumanBytes(total) + "  " + speed
			})
		}
	})
	ok = err == nil
	return err
}
