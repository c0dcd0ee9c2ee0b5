package bench

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/lab"
)

// TestMatrixResume: a resumed table keeps the earlier run's rows, with the
// run that measured each, skips their scenarios, and refuses another set.
func TestMatrixResume(t *testing.T) {
	scs := lab.Generate(7, 3)
	prev := &MatrixReport{Started: time.Date(2026, 11, 28, 4, 21, 0, 0, time.UTC), Command: "benchrun -matrix -seed 7 -n 3",
		Seed: 7, N: 3, Uptime: "up 15 min", Error: "stopped by hand", Rows: []MatrixRow{{Scenario: scs[0]}}}
	rep := &MatrixReport{Started: time.Now(), Command: "benchrun -matrix -seed 7 -n 3 -resume", Seed: 7, N: 3, Planned: 3}
	done, err := rep.Resume(prev, MatrixRun{Command: rep.Command, Commit: "abc1234", Started: time.Now()})
	require.NoError(t, err)
	assert.Equal(t, map[string]bool{scs[0].Name: true}, done)
	require.Len(t, rep.Rows, 1)
	assert.Equal(t, 0, rep.Rows[0].Run, "the earlier row is the first run's")
	require.Len(t, rep.Runs, 2)
	assert.Equal(t, "stopped by hand", rep.Runs[0].Error)
	assert.Equal(t, prev.Started, rep.Started, "the table is dated by its first run")

	rep.Rows = append(rep.Rows, MatrixRow{Scenario: scs[1], Run: 1})
	rep.Rescore()
	md := rep.Markdown()
	assert.Contains(t, md, "The rows come from 2 runs")
	assert.Contains(t, md, "source abc1234")
	assert.Contains(t, md, "ended early: stopped by hand")
	var runs []string
	for _, line := range strings.Split(md, "\n") {
		if strings.HasPrefix(line, "| "+scs[0].Name+" |") || strings.HasPrefix(line, "| "+scs[1].Name+" |") {
			cells := strings.Split(strings.TrimSuffix(line, " |"), " | ")
			runs = append(runs, cells[len(cells)-1])
		}
	}
	assert.Equal(t, []string{"1", "2"}, runs, "each row names its run")

	// The rows of the first run run again (REDO=1): the second run's stay,
	// and the first run's until its new row replaces it, in the set's order.
	again := &MatrixReport{Seed: 7, N: 3, Planned: 3}
	done, err = again.Resume(rep, MatrixRun{Command: "benchrun -matrix -seed 7 -n 3 -resume -redo 1"}, 1)
	require.NoError(t, err)
	assert.Equal(t, map[string]bool{scs[1].Name: true}, done, "the first run's row runs again")
	require.Len(t, again.Rows, 2, "a row to run again stays until it is replaced")
	assert.Len(t, again.Runs, 3)
	set := []string{scs[0].Name, scs[1].Name, scs[2].Name}
	again.Put(MatrixRow{Scenario: scs[2], Run: 2}, set)
	again.Put(MatrixRow{Scenario: scs[0], Run: 2}, set)
	require.Len(t, again.Rows, 3)
	for i, r := range again.Rows {
		assert.Equal(t, set[i], r.Scenario.Name, "the set's order")
	}
	assert.Equal(t, []int{2, 1, 2}, []int{again.Rows[0].Run, again.Rows[1].Run, again.Rows[2].Run}, "the first run's row replaced")

	other := &MatrixReport{Seed: 8, N: 3}
	_, err = other.Resume(prev, MatrixRun{})
	assert.ErrorContains(t, err, "same SEED, N and NAMED")

	// A named scenario added since the table was begun: the table resumes,
	// and the new scenario is among those to run; one taken out since, or
	// the order changed: another set.
	names := func(ns ...string) []string { return ns }
	prev.Named = names("a", "b", scs[0].Name, scs[1].Name, scs[2].Name)
	grown := &MatrixReport{Seed: 7, N: 3, Named: names("a", "b", "hdfs-slow-dir", scs[0].Name, scs[1].Name, scs[2].Name)}
	done, err = grown.Resume(prev, MatrixRun{})
	require.NoError(t, err)
	assert.False(t, done["hdfs-slow-dir"])
	for _, n := range [][]string{names("a", scs[0].Name, scs[1].Name, scs[2].Name), names("b", "a", scs[0].Name, scs[1].Name, scs[2].Name)} {
		_, err = (&MatrixReport{Seed: 7, N: 3, Named: n}).Resume(prev, MatrixRun{})
		assert.ErrorContains(t, err, "same SEED, N and NAMED", "%v", n)
	}
}

// TestRegimesFromTheDaemonsLog: a regime entered and cleared between two
// status polls is still reported, from the daemon's log.
func TestRegimesFromTheDaemonsLog(t *testing.T) {
	log := t.TempDir() + "/readaheadd.log"
	require.NoError(t, os.WriteFile(log, []byte(`{"time":"2026-11-28T08:00:00Z","level":"INFO","msg":"detector: regime entered","regime":"file_latency_shift","device":"7:0"}
{"time":"2026-11-28T08:00:01Z","level":"INFO","msg":"detector: regime cleared","regime":"file_latency_shift","device":"7:0"}
{"time":"2026-11-28T08:00:02Z","level":"INFO","msg":"tuner: action","regime":"contention"}
not json
`), 0o644))
	d := &Daemon{LogPath: log, regimes: map[string]bool{"tail_inflation": true}}
	assert.Equal(t, []string{"file_latency_shift", "tail_inflation"}, d.Regimes())
}
