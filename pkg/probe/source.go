package probe

import (
	"context"
	"sync"
)

// Handler receives the probe's events, from one goroutine, in ring order.
type Handler interface {
	HandleRecord(Record)
	HandleReadahead(ReadaheadEvent)
}

// Source is a stream of block-read records and readahead events plus the
// kernel-side aggregates: *Probe in production, Replay in tests.
type Source interface {
	// Run delivers events to h from the calling goroutine until ctx is
	// done (then it returns nil) or the source fails.
	Run(ctx context.Context, h Handler) error
	// Stats returns the aggregates since the source was started.
	Stats() (Stats, error)
	Close() error
}

// HandlerFuncs adapts two functions to a Handler; nil functions ignore
// their events.
type HandlerFuncs struct {
	Record    func(Record)
	Readahead func(ReadaheadEvent)
}

// HandleRecord implements Handler.
func (f HandlerFuncs) HandleRecord(r Record) {
	if f.Record != nil {
		f.Record(r)
	}
}

// HandleReadahead implements Handler.
func (f HandlerFuncs) HandleReadahead(e ReadaheadEvent) {
	if f.Readahead != nil {
		f.Readahead(e)
	}
}

// Event is one item of a Replay: exactly one of Record and Readahead is set.
type Event struct {
	Record    *Record
	Readahead *ReadaheadEvent
}

// Replay is a Source that plays back a fixed list of events, for tests of
// everything downstream of the probe. Stats aggregates the records
// delivered so far the way the kernel side does.
type Replay struct {
	Events []Event
	// Hold keeps Run blocked after the last event until ctx is done, as a
	// live probe does; otherwise Run returns nil when the events run out.
	Hold bool

	mu    sync.Mutex
	agg   Aggregator
	close bool
}

// NewReplay returns a Replay of records only.
func NewReplay(recs ...Record) *Replay {
	r := &Replay{}
	for i := range recs {
		r.Events = append(r.Events, Event{Record: &recs[i]})
	}
	return r
}

// Run implements Source.
func (r *Replay) Run(ctx context.Context, h Handler) error {
	for _, e := range r.Events {
		if ctx.Err() != nil {
			return nil
		}
		r.mu.Lock()
		closed := r.close
		if e.Record != nil && !closed {
			r.agg.Add(*e.Record)
		}
		r.mu.Unlock()
		if closed {
			return ErrClosed
		}
		switch {
		case e.Record != nil:
			h.HandleRecord(*e.Record)
		case e.Readahead != nil:
			h.HandleReadahead(*e.Readahead)
		}
	}
	if r.Hold {
		<-ctx.Done()
	}
	return nil
}

// Stats implements Source.
func (r *Replay) Stats() (Stats, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.agg.Stats(), nil
}

// Close implements Source.
func (r *Replay) Close() error {
	r.mu.Lock()
	r.close = true
	r.mu.Unlock()
	return nil
}
