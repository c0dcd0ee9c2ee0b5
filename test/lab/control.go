package lab

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"sync"
	"time"
)

// control talks to labfs's control socket. labfs serves one connection at
// a time, so every command uses its own short connection: a test holding
// the lab never locks out `lab regime` from a shell.
type control struct {
	path string
	mu   sync.Mutex
}

// do sends one command line and returns labfs's reply ("ok ..." or JSON).
func (c *control) do(line string) (string, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	conn, err := net.DialTimeout("unix", c.path, 2*time.Second)
	if err != nil {
		return "", fmt.Errorf("connect to labfs control socket %s: %w (is the lab up?)", c.path, err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(line + "\n")); err != nil {
		return "", fmt.Errorf("labfs control: %w", err)
	}
	reply, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("labfs control: no reply to %q: %w", firstWord(line), err)
	}
	reply = strings.TrimSpace(reply)
	if strings.HasPrefix(reply, "err ") {
		return "", fmt.Errorf("labfs refused %q: %s", firstWord(line), strings.TrimPrefix(reply, "err "))
	}
	return reply, nil
}

func (c *control) close() {}

func firstWord(s string) string {
	w, _, _ := strings.Cut(s, " ")
	return w
}

// label makes a ground-truth label safe for the one-line protocol.
func label(s string) string {
	s = strings.NewReplacer("\n", " ", "\r", " ").Replace(s)
	if s == "" {
		return ""
	}
	return " # " + s
}

func us(d time.Duration) string { return fmt.Sprintf("%g", float64(d)/float64(time.Microsecond)) }

// Range is a byte range of the device (= of the image).
type Range struct {
	Off, Len uint64
}

func rangesArg(rs []Range) string {
	var b strings.Builder
	for _, r := range rs {
		fmt.Fprintf(&b, " %d:%d", r.Off, r.Len)
	}
	return b.String()
}

// fileRanges maps files to the device byte ranges holding their data.
func fileRanges(paths []string) ([]Range, error) {
	var rs []Range
	for _, p := range paths {
		exts, err := Extents(p)
		if err != nil {
			return nil, err
		}
		if len(exts) == 0 {
			return nil, fmt.Errorf("%s has no extents: is it empty?", p)
		}
		for _, e := range exts {
			rs = append(rs, Range{Off: e.Physical, Len: e.Length})
		}
	}
	return rs, nil
}

// SetModel changes the device model at run time.
func (l *Lab) SetModel(m Model) error {
	_, err := l.ctl.do(fmt.Sprintf("model %s %g %d", us(m.Latency), m.BandwidthMBps, m.Slots))
	return err
}

// SetPermanent adds extra latency to every read of the given files' extents
// (a permanent slowdown), until cleared.
func (l *Lab) SetPermanent(extra time.Duration, paths ...string) error {
	rs, err := fileRanges(paths)
	if err != nil {
		return fmt.Errorf("permanent regime: %w", err)
	}
	return l.SetPermanentRanges(extra, rs, strings.Join(paths, " "))
}

// SetPermanentRanges is SetPermanent on raw device ranges.
func (l *Lab) SetPermanentRanges(extra time.Duration, rs []Range, what string) error {
	_, err := l.ctl.do("permanent " + us(extra) + rangesArg(rs) + label(what))
	return err
}

// Temporal is a periodic tail-latency regime: during the first Duration of
// every Period, a Fraction of all reads on the device wait Extra more.
type Temporal struct {
	Period, Duration time.Duration
	Fraction         float64
	Extra            time.Duration
}

// SetTemporal starts a temporal regime; its windows start now. It returns
// the CLOCK_MONOTONIC time the first window started.
func (l *Lab) SetTemporal(t Temporal) (time.Duration, error) {
	reply, err := l.ctl.do(fmt.Sprintf("temporal %g %g %g %s%s",
		float64(t.Period)/float64(time.Millisecond), float64(t.Duration)/float64(time.Millisecond),
		t.Fraction, us(t.Extra), label("device")))
	if err != nil {
		return 0, err
	}
	var start int64
	if _, err := fmt.Sscanf(reply, "ok %d", &start); err != nil {
		return 0, fmt.Errorf("labfs temporal reply %q: %w", reply, err)
	}
	return time.Duration(start), nil
}

// SetIntrinsic makes the first firstN reads after a read crosses into a new
// extent of each file wait extra more (an intrinsic slowdown).
func (l *Lab) SetIntrinsic(firstN int, extra time.Duration, paths ...string) error {
	for _, p := range paths {
		rs, err := fileRanges([]string{p})
		if err != nil {
			return fmt.Errorf("intrinsic regime: %w", err)
		}
		if _, err := l.ctl.do(fmt.Sprintf("intrinsic %d %s%s%s", firstN, us(extra), rangesArg(rs), label(p))); err != nil {
			return err
		}
	}
	return nil
}

// SetDevice makes every read of the whole device wait extra more (a
// fail-slow drive), on top of any other regime; 0 ends it.
func (l *Lab) SetDevice(extra time.Duration) error {
	_, err := l.ctl.do("device " + us(extra) + label("device"))
	return err
}

// Clear ends regimes: "permanent", "temporal", "intrinsic", "device", or
// all when none is named.
func (l *Lab) Clear(what ...string) error {
	if len(what) == 0 {
		what = []string{"all"}
	}
	for _, w := range what {
		if _, err := l.ctl.do("clear " + w); err != nil {
			return err
		}
	}
	return nil
}

// Mark records an event (no spaces in name) in the ground truth.
func (l *Lab) Mark(name, what string) error {
	if name == "" || strings.ContainsAny(name, " \t\n#") {
		return fmt.Errorf("ground-truth event name %q must be one word", name)
	}
	_, err := l.ctl.do("mark " + name + label(what))
	return err
}

// Stats are labfs's counters.
type Stats struct {
	Reads          uint64  `json:"reads"`
	ReadBytes      uint64  `json:"read_bytes"`
	Writes         uint64  `json:"writes"`
	WriteBytes     uint64  `json:"write_bytes"`
	HitsPermanent  uint64  `json:"hits_permanent"`
	HitsTemporal   uint64  `json:"hits_temporal"`
	HitsIntrinsic  uint64  `json:"hits_intrinsic"`
	HitsDevice     uint64  `json:"hits_device"`
	DeviceExtraUS  float64 `json:"device_extra_us"`
	Inflight       int     `json:"inflight"`
	MaxInflight    int     `json:"max_inflight"`
	LatencyUS      float64 `json:"lat_us"`
	BandwidthMBps  float64 `json:"bw_mbps"`
	Slots          int     `json:"slots"`
	PermRanges     int     `json:"permanent_ranges"`
	TemporalOn     int     `json:"temporal"`
	IntrinsicFiles int     `json:"intrinsic_files"`
}

// Stats reads labfs's counters.
func (l *Lab) Stats() (Stats, error) {
	var s Stats
	reply, err := l.ctl.do("stats")
	if err != nil {
		return s, err
	}
	if err := json.Unmarshal([]byte(reply), &s); err != nil {
		return s, fmt.Errorf("labfs stats %q: %w", reply, err)
	}
	return s, nil
}

// Event is one ground-truth record: a regime change applied by labfs.
type Event struct {
	Mono  time.Duration  // CLOCK_MONOTONIC
	Wall  time.Time      // wall clock
	Event string         // start, model, permanent, temporal, intrinsic, clear, stop, or a Mark name
	Label string         // files or what the regime applies to
	Raw   map[string]any // every field as written
}

// GroundTruth reads the lab's ground-truth events in order.
func (l *Lab) GroundTruth() ([]Event, error) { return ReadGroundTruth(l.st.Truth) }

// TruthFile is the path of the ground-truth JSON-lines file.
func (l *Lab) TruthFile() string { return l.st.Truth }

// ReadGroundTruth parses a ground-truth JSON-lines file.
func ReadGroundTruth(path string) ([]Event, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Event
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 8<<20)
	for sc.Scan() {
		var raw map[string]any
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.UseNumber()
		if err := dec.Decode(&raw); err != nil {
			return out, fmt.Errorf("ground truth %s: %w", path, err)
		}
		mono, _ := raw["mono_ns"].(json.Number).Int64()
		wall, _ := raw["wall_ns"].(json.Number).Int64()
		ev, _ := raw["event"].(string)
		lb, _ := raw["label"].(string)
		out = append(out, Event{Mono: time.Duration(mono), Wall: time.Unix(0, wall), Event: ev, Label: lb, Raw: raw})
	}
	return out, sc.Err()
}

// Request is one read request as labfs served it (Options.RequestLog).
type Request struct {
	Start   time.Duration `json:"-"` // CLOCK_MONOTONIC arrival at labfs
	Off     uint64        `json:"off"`
	Len     uint64        `json:"len"`
	Latency time.Duration `json:"-"`   // arrival to reply
	Extra   time.Duration `json:"-"`   // latency the regimes added
	Why     string        `json:"why"` // regimes that added it: p, t, i, d (device)
	T       int64         `json:"t"`
	LatNS   int64         `json:"lat_ns"`
	ExtraNS int64         `json:"extra_ns"`
}

// RequestLog returns the reads labfs served since start (needs
// Options.RequestLog).
func (l *Lab) RequestLog() ([]Request, error) {
	if l.st.ReqLog == "" {
		return nil, errors.New("request log is off: start the lab with Options.RequestLog")
	}
	if _, err := l.ctl.do("flush"); err != nil {
		return nil, err
	}
	f, err := os.Open(l.st.ReqLog)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []Request
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r Request
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return out, fmt.Errorf("request log: %w", err)
		}
		r.Start, r.Latency, r.Extra = time.Duration(r.T), time.Duration(r.LatNS), time.Duration(r.ExtraNS)
		out = append(out, r)
	}
	return out, sc.Err()
}
