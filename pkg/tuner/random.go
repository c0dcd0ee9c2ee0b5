package tuner

import (
	"fmt"
	"time"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// A random reader beside a stream (an mmap reader faulting pages, a service
// reading records) waits, on each of its reads, behind the transfers the
// stream's window keeps queued: a larger window for the stream is paid in
// its latency and so in its rate. Its bytes say nothing of that (a trimmed
// reader reads fewer bytes by design), its requests and their latency do.
// A stream's step is kept only if the random readers beside it did not
// lose: their requests per second within randLossMax of what they were
// before the step and at the stream's base window, their p99 within
// randLatMax. Judged against the base window too, so that steps that each
// cost a little do not add up.
//
// A random reader's own read-around trim makes its reads cheaper than they
// were under the device's window, and that gain is the stream's to use: when
// every random reader beside the stream was seen at the default window
// (no window of the tuner's raised on the device, its file not trimmed,
// within randDefaultFresh), the step is judged against that instead. (What
// it got just before its trim is no reference: the trim comes with the
// stream's first trial, whose queue it already waits behind.)
const (
	randLossMax      = 0.05
	randLatMax       = 0.10
	randDefaultFresh = 5 * time.Minute
)

// randRef is a random reader's requests per second and p99 at the
// device's default window.
type randRef struct {
	req float64
	p99 time.Duration
	at  time.Duration
}

// noteRandomDefaults records the random readers of devices where the tuner
// holds no raised window: what they get from the default window.
func (t *Tuner) noteRandomDefaults(now time.Duration) {
	if t.randDefault == nil {
		t.randDefault = map[probe.FileKey]randRef{}
	}
	for k, r := range t.randDefault {
		if now-r.at > randDefaultFresh {
			delete(t.randDefault, k)
		}
	}
	for k, fs := range t.fstats {
		if t.trims[k] != nil || !t.readRandomly(fs) {
			continue
		}
		// Only a reader whose faults read around at the device's window:
		// one whose open file still holds a trim (the tuner's record of
		// it ended, the pin not yet) would make a cheap reference.
		if d := t.device(fs.Device); d == nil || t.helping(d) || !readAroundSized(fs, min(d.orig, t.cfg.TrimKB)) {
			continue
		}
		t.randDefault[k] = randRef{req: float64(fs.Requests) / t.cfg.Settle.Seconds(), p99: fs.P99, at: now}
	}
}

// randomLost says how the random readers beside a stream lost by its step
// (m against the step's before-measure and the decision's base-window
// measure), "" if they did not or there were none in both.
func randomLost(l *ladder, m measure) string {
	if m.randReq > 0 && m.randDefReq > 0 {
		if m.randReq < (1-randLossMax)*m.randDefReq {
			return fmt.Sprintf("the random readers beside it lost: %.0f requests/s, %.0f at the device's default window", m.randReq, m.randDefReq)
		}
		if m.randDefP99 > 0 && m.randP99 > time.Duration(float64(m.randDefP99)*(1+randLatMax)) {
			return fmt.Sprintf("the random readers beside it lost: p99 %v, %v at the device's default window", m.randP99, m.randDefP99)
		}
		return ""
	}
	for _, ref := range []struct {
		name string
		m    measure
	}{{"before the step", l.before}, {"at the stream's base window", l.baseM}} {
		b := ref.m
		if b.randReq <= 0 || m.randReq <= 0 {
			continue
		}
		if m.randReq < (1-randLossMax)*b.randReq {
			return fmt.Sprintf("the random readers beside it lost: %.0f -> %.0f requests/s (%s)", b.randReq, m.randReq, ref.name)
		}
		if b.randP99 > 0 && m.randP99 > time.Duration(float64(b.randP99)*(1+randLatMax)) {
			return fmt.Sprintf("the random readers beside it lost: p99 %v -> %v (%s)", b.randP99, m.randP99, ref.name)
		}
	}
	return ""
}

// trimComing reports whether a random reader on the device has its
// read-around trim under trial, or is read-around sized and not trimmed
// yet (its trim comes with the device's raised window).
func (t *Tuner) trimComing(d *devState) bool {
	for _, td := range t.trims {
		if td.dev == d && td.trialAt != 0 {
			return true
		}
	}
	if k, ok := t.randomOnDevice(d.dev); ok && t.trims[k] == nil {
		return true
	}
	return false
}

// randomUnseen reports whether a random reader on the device has not been
// seen at the default window yet and is not trimmed: a fresh stream's
// first step waits one interval for it, or every later step beside it
// would be judged against the stream's own first trial.
func (t *Tuner) randomUnseen(dev probe.Dev) bool {
	for k, fs := range t.fstats {
		if fs.Device == dev && t.trims[k] == nil && t.readRandomly(fs) {
			if _, ok := t.randDefault[k]; !ok {
				return true
			}
		}
	}
	return false
}
