package acl

import (
	"context"
	"errors"
	"time"
)

// RecheckTimeout bounds the catch-up before a refusal is checked again.
// A member that cannot catch up within it refuses as it first did.
const RecheckTimeout = 2 * time.Second

// Recheck runs check and, when it refuses (a DeniedError or ErrNotFound),
// runs catchUp and check once more. A member that lags its leader may not
// have applied yet the token, session or service a request names, made
// moments ago through another member: its refusal would be wrong, and
// wrong in a way a client cannot tell from a real one. catchUp brings the
// member to what the leader had committed; it is bounded by
// RecheckTimeout. Only refusals pay for it.
func Recheck(ctx context.Context, catchUp func(context.Context) error, check func() error) error {
	if err := check(); err != nil {
		return recheck(ctx, catchUp, check, err)
	}
	return nil
}

// recheck is Recheck after check returned err. NB: a function of its own
// so that errors.As's target, which escapes, is allocated only on a
// refusal and not on every authorized call.
func recheck(ctx context.Context, catchUp func(context.Context) error, check func() error, err error) error {
	var de *DeniedError
	if !errors.As(err, &de) && !errors.Is(err, ErrNotFound) {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, RecheckTimeout)
	defer cancel()
	if catchUp(ctx) != nil {
		return err
	}
	return check()
}
