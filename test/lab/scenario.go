package lab

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strings"
	"sync"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration written as "1.5ms" or "20s" in scenario files.
type Duration time.Duration

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := time.ParseDuration(n.Value)
	if err != nil {
		return fmt.Errorf("line %d: %q is not a duration such as 1.5ms or 20s", n.Line, n.Value)
	}
	*d = Duration(v)
	return nil
}

// D returns the time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// ScenarioFile is a file a scenario creates before its timeline starts.
type ScenarioFile struct {
	Name string `yaml:"name"`
	MB   int    `yaml:"mb"`
	// FragmentedWith names a second file written interleaved with this one
	// (both fragmented, in ChunkMB pieces).
	FragmentedWith string `yaml:"fragmented_with,omitempty"`
	ChunkMB        int    `yaml:"chunk_mb,omitempty"`
}

// Step applies one regime at At (since the timeline started) and, when
// Until is set, clears it again then.
type Step struct {
	At    Duration `yaml:"at"`
	Until Duration `yaml:"until,omitempty"`
	// Regime: permanent, temporal, intrinsic, contention, clear.
	Regime   string   `yaml:"regime"`
	Files    []string `yaml:"files,omitempty"`
	Extra    Duration `yaml:"extra,omitempty"`
	Period   Duration `yaml:"period,omitempty"`
	Duration Duration `yaml:"duration,omitempty"`
	Fraction float64  `yaml:"fraction,omitempty"`
	FirstN   int      `yaml:"first_n,omitempty"`
	Readers  int      `yaml:"readers,omitempty"`
	BlockKB  int      `yaml:"block_kb,omitempty"`
}

// Reader is a workload a scenario runs during its timeline: a sequential
// reader ("seq", re-reading the file with its cache dropped before each
// pass) or a random mmap reader ("random").
type Reader struct {
	Kind string   `yaml:"kind"`
	File string   `yaml:"file"`
	From Duration `yaml:"from,omitempty"`
}

// Scenario combines regimes over time.
type Scenario struct {
	Name    string         `yaml:"name"`
	Length  Duration       `yaml:"length"`
	Files   []ScenarioFile `yaml:"files"`
	Steps   []Step         `yaml:"steps"`
	Readers []Reader       `yaml:"readers,omitempty"`
}

// LoadScenario reads a scenario file (YAML, or JSON, which is YAML).
func LoadScenario(path string) (*Scenario, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var s Scenario
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", path, err)
	}
	if err := s.Validate(); err != nil {
		return nil, fmt.Errorf("scenario %s: %w", path, err)
	}
	return &s, nil
}

// Validate checks that the scenario can run.
func (s *Scenario) Validate() error {
	if s.Length <= 0 {
		return errors.New("length must be positive, e.g. length: 60s")
	}
	files := map[string]bool{}
	for _, f := range s.Files {
		if f.Name == "" || strings.Contains(f.Name, "/") || f.MB < 1 {
			return fmt.Errorf("file %q: give a plain name and mb >= 1", f.Name)
		}
		files[f.Name] = true
		if f.FragmentedWith != "" {
			files[f.FragmentedWith] = true
		}
	}
	for i, st := range s.Steps {
		where := fmt.Sprintf("step %d (%s at %s)", i+1, st.Regime, st.At.D())
		if st.At < 0 || st.At > s.Length || (st.Until != 0 && st.Until <= st.At) {
			return fmt.Errorf("%s: need 0 <= at <= length and until > at", where)
		}
		for _, f := range st.Files {
			if !files[f] {
				return fmt.Errorf("%s: file %q is not among the scenario's files", where, f)
			}
		}
		switch st.Regime {
		case "permanent":
			if len(st.Files) == 0 || st.Extra <= 0 {
				return fmt.Errorf("%s: needs files and extra", where)
			}
		case "temporal":
			if st.Period <= 0 || st.Duration <= 0 || st.Duration > st.Period || st.Fraction <= 0 || st.Fraction > 1 || st.Extra <= 0 {
				return fmt.Errorf("%s: needs period, duration <= period, 0 < fraction <= 1 and extra", where)
			}
		case "intrinsic":
			if len(st.Files) == 0 || st.Extra <= 0 || st.FirstN < 1 {
				return fmt.Errorf("%s: needs files, first_n and extra", where)
			}
		case "contention":
			if len(st.Files) != 1 {
				return fmt.Errorf("%s: needs exactly one file to read in the background", where)
			}
		case "clear":
		default:
			return fmt.Errorf("%s: regime must be permanent, temporal, intrinsic, contention or clear", where)
		}
	}
	for _, r := range s.Readers {
		if (r.Kind != "seq" && r.Kind != "random") || !files[r.File] {
			return fmt.Errorf("reader %s of %q: kind must be seq or random, file one of the scenario's", r.Kind, r.File)
		}
	}
	return nil
}

// Prepare creates the scenario's files in the lab.
func (s *Scenario) Prepare(l *Lab) error {
	for _, f := range s.Files {
		var err error
		if f.FragmentedWith != "" {
			chunk := f.ChunkMB
			if chunk == 0 {
				chunk = 4
			}
			_, _, err = l.WriteFragmented(f.Name, f.FragmentedWith, f.MB, chunk)
		} else {
			_, err = l.WriteFile(f.Name, f.MB)
		}
		if err != nil {
			return fmt.Errorf("scenario file %s: %w", f.Name, err)
		}
	}
	return nil
}

// ReaderSample is one throughput or latency sample of a scenario reader.
type ReaderSample struct {
	At    time.Duration // since the timeline started
	File  string
	Kind  string
	MBps  float64       // seq readers
	Rate  float64       // random readers: touches/s
	P99   time.Duration // random readers
	Phase string        // regimes active when the sample ended
}

// Run prepares the files, then applies the steps on the timeline, records
// each in the ground truth, runs the readers, and clears everything at the
// end (or when ctx ends). It returns the readers' samples.
func (s *Scenario) Run(ctx context.Context, l *Lab) ([]ReaderSample, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if err := s.Prepare(l); err != nil {
		return nil, err
	}
	type ev struct {
		at    time.Duration
		step  Step
		clear bool
	}
	var evs []ev
	for _, st := range s.Steps {
		evs = append(evs, ev{at: st.At.D(), step: st})
		if st.Until > 0 {
			evs = append(evs, ev{at: st.Until.D(), step: st, clear: true})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].at < evs[j].at })

	ctx, cancel := context.WithTimeout(ctx, s.Length.D())
	defer cancel()
	if err := l.Mark("scenario-start", s.Name); err != nil {
		return nil, err
	}
	start := time.Now()
	var mu sync.Mutex
	active := map[string]bool{}
	phase := func() string {
		mu.Lock()
		defer mu.Unlock()
		var p []string
		for k := range active {
			p = append(p, k)
		}
		sort.Strings(p)
		if len(p) == 0 {
			return "healthy"
		}
		return strings.Join(p, "+")
	}
	var samples []ReaderSample
	var wg sync.WaitGroup
	for _, r := range s.Readers {
		wg.Add(1)
		go func(r Reader) {
			defer wg.Done()
			out := runReader(ctx, l, r, start, phase)
			mu.Lock()
			samples = append(samples, out...)
			mu.Unlock()
		}(r)
	}
	conts := map[string]*Contention{}
	var runErr error
	for _, e := range evs {
		select {
		case <-ctx.Done():
		case <-time.After(time.Until(start.Add(e.at))):
		}
		if ctx.Err() != nil {
			break
		}
		key := e.step.Regime + ":" + strings.Join(e.step.Files, ",")
		var err error
		if e.clear {
			err = clearStep(l, e.step, conts)
			mu.Lock()
			delete(active, e.step.Regime)
			mu.Unlock()
		} else {
			err = applyStep(l, e.step, conts)
			mu.Lock()
			if e.step.Regime == "clear" {
				active = map[string]bool{}
			} else {
				active[e.step.Regime] = true
			}
			mu.Unlock()
		}
		if err != nil {
			runErr = fmt.Errorf("scenario step %s at %s: %w", key, e.at, err)
			cancel()
			break
		}
		slog.Info("scenario step", "at", e.at, "regime", e.step.Regime, "files", e.step.Files, "clear", e.clear)
	}
	<-ctx.Done()
	wg.Wait()
	for _, c := range conts {
		c.Stop()
	}
	if err := l.Clear(); err != nil && runErr == nil {
		runErr = err
	}
	if err := l.Mark("scenario-end", s.Name); err != nil && runErr == nil {
		runErr = err
	}
	sort.Slice(samples, func(i, j int) bool { return samples[i].At < samples[j].At })
	return samples, runErr
}

func applyStep(l *Lab, st Step, conts map[string]*Contention) error {
	switch st.Regime {
	case "permanent":
		return l.SetPermanent(st.Extra.D(), l.paths(st.Files)...)
	case "temporal":
		_, err := l.SetTemporal(Temporal{Period: st.Period.D(), Duration: st.Duration.D(), Fraction: st.Fraction, Extra: st.Extra.D()})
		return err
	case "intrinsic":
		return l.SetIntrinsic(st.FirstN, st.Extra.D(), l.paths(st.Files)...)
	case "contention":
		c, err := l.StartContention(st.Files[0], st.Readers, st.BlockKB)
		if err != nil {
			return err
		}
		conts[st.Files[0]] = c
		return nil
	case "clear":
		for k, c := range conts {
			c.Stop()
			delete(conts, k)
		}
		return l.Clear()
	}
	return fmt.Errorf("unknown regime %q", st.Regime)
}

func clearStep(l *Lab, st Step, conts map[string]*Contention) error {
	if st.Regime == "contention" {
		if c := conts[st.Files[0]]; c != nil {
			delete(conts, st.Files[0])
			return c.Stop()
		}
		return nil
	}
	// Clearing drops every regime of this kind: a scenario that overlaps
	// two permanent steps clears both at the first until.
	return l.Clear(st.Regime)
}

func (l *Lab) paths(names []string) []string {
	out := make([]string, len(names))
	for i, n := range names {
		out[i] = l.path(n)
	}
	return out
}

func runReader(ctx context.Context, l *Lab, r Reader, start time.Time, phase func() string) []ReaderSample {
	select {
	case <-ctx.Done():
		return nil
	case <-time.After(time.Until(start.Add(r.From.D()))):
	}
	p := l.path(r.File)
	var out []ReaderSample
	for ctx.Err() == nil {
		switch r.Kind {
		case "seq":
			if err := DropFileCache(p); err != nil {
				slog.Warn("scenario reader", "file", p, "err", err)
				return out
			}
			sr, err := OpenSeq(p)
			if err != nil {
				slog.Warn("scenario reader", "file", p, "err", err)
				return out
			}
			t0 := time.Since(start)
			res, err := sr.Read(ctx, 500*time.Millisecond)
			sr.Close()
			if err != nil {
				slog.Warn("scenario reader", "file", p, "err", err)
				return out
			}
			for _, smp := range res.Samples {
				out = append(out, ReaderSample{At: t0 + smp.At, File: r.File, Kind: r.Kind, MBps: smp.MBps, Phase: phase()})
			}
		case "random":
			res, err := RandomMmapRead(ctx, p, time.Second, uint64(time.Now().UnixNano()))
			if err != nil {
				slog.Warn("scenario reader", "file", p, "err", err)
				return out
			}
			out = append(out, ReaderSample{At: time.Since(start), File: r.File, Kind: r.Kind, Rate: res.PerSec(), P99: res.P99, Phase: phase()})
		}
	}
	return out
}
