package bench

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// capture records every completed block read on one device with the
// project's own BPF probe (block-layer latency per request and the file it
// read), the same way for every arm.
type capture struct {
	p      *probe.Probe
	cancel context.CancelFunc
	done   chan error
	mu     sync.Mutex
	recs   []probe.Record
	once   sync.Once
}

func startCapture(dev probe.Dev) (*capture, error) {
	p, err := probe.Load(probe.Config{Devices: []probe.Dev{dev}, Poll: 50 * time.Millisecond})
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &capture{p: p, cancel: cancel, done: make(chan error, 1)}
	go func() {
		c.done <- p.Run(ctx, probe.HandlerFuncs{Record: func(r probe.Record) {
			if r.Error {
				return
			}
			c.mu.Lock()
			c.recs = append(c.recs, r)
			c.mu.Unlock()
		}})
	}()
	return c, nil
}

// stop ends the capture and returns what it saw.
func (c *capture) stop() []probe.Record {
	if c == nil {
		return nil
	}
	c.once.Do(func() {
		time.Sleep(150 * time.Millisecond) // the last records drain
		c.cancel()
		<-c.done
		_ = c.p.Close()
	})
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.recs
}

// latStats splits records at onset (monotonic) into before and after.
type latStats struct {
	pre, post []time.Duration
	// postBytes is bytes read after onset per file inode.
	postBytes map[uint64]uint64
}

func splitRecords(recs []probe.Record, onset time.Duration) latStats {
	s := latStats{postBytes: map[uint64]uint64{}}
	for _, r := range recs {
		if r.Issue < onset {
			s.pre = append(s.pre, r.Latency)
			continue
		}
		s.post = append(s.post, r.Latency)
		if r.Kind == probe.KindFile {
			s.postBytes[r.File.Ino] += uint64(r.Bytes)
		}
	}
	sort.Slice(s.pre, func(i, j int) bool { return s.pre[i] < s.pre[j] })
	sort.Slice(s.post, func(i, j int) bool { return s.post[i] < s.post[j] })
	return s
}

// thin keeps at most n evenly ranked values of a sorted sample (for CDFs).
func thin(sorted []time.Duration, n int) []float64 {
	if len(sorted) == 0 {
		return nil
	}
	if len(sorted) <= n {
		out := make([]float64, len(sorted))
		for i, d := range sorted {
			out[i] = ms(d)
		}
		return out
	}
	out := make([]float64, n)
	for i := range out {
		out[i] = ms(sorted[i*(len(sorted)-1)/(n-1)])
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
