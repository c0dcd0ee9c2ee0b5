package lab_test

import (
	"reflect"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/test/lab"
)

// The generator is a test asset: the same seed gives the same scenarios,
// scenario i does not depend on how many are drawn, and every drawn
// scenario can run.
func TestMatrixGenerateDeterministicAndValid(t *testing.T) {
	a, b := lab.Generate(7, 40), lab.Generate(7, 40)
	require.True(t, reflect.DeepEqual(a, b), "one seed, two different sets")
	assert.True(t, reflect.DeepEqual(a[:10], lab.Generate(7, 10)), "scenario i must depend on (seed, i) only")
	assert.False(t, reflect.DeepEqual(a, lab.Generate(8, 40)), "another seed, the same set")
	names := map[string]bool{}
	for _, s := range a {
		require.NoError(t, s.Validate())
		assert.False(t, names[s.Name], "name %s twice", s.Name)
		names[s.Name] = true
		assert.NotEmpty(t, s.Streams(), "%s: every scenario has a stream", s.Name)
		assert.LessOrEqual(t, s.DataMB(), 3000, "%s: the lab's RAM image must stay small", s.Name)
		if s.Device.FileExtra > 0 {
			assert.True(t, s.Readers[0].Slow, "%s: slowed files but the first stream's is not", s.Name)
		}
		if !s.Device.Slowed() {
			assert.Equal(t, lab.StartOnset, s.Start, "%s: a healthy device has nothing to be slow before", s.Name)
		}
		for _, d := range []float64{float64(s.Device.FileExtra), float64(s.Device.DeviceExtra)} {
			if d > 0 {
				assert.True(t, d >= 0.5e6 && d <= 8e6, "%s: extra latency %v ns outside 0.5-8 ms", s.Name, d)
			}
		}
	}
}

// A full matrix (60 scenarios from seed 1, what `make bench-matrix N=60`
// runs) covers every class; the named ones are the four classes the
// hand-picked slices missed.
func TestMatrixCoverage(t *testing.T) {
	cov := lab.Coverage(lab.Generate(1, 60))
	for _, c := range lab.AllClasses {
		assert.Positive(t, cov[c], "class %s not covered by seed 1, N=60", c)
	}
	want := map[string][]string{
		"whole-device-bursty": {lab.CWhole, lab.KMmapBurst, lab.StartBeforeDaemon},
		"saturated-streams":   {lab.CSaturated, lab.CStreamOnly},
		"slow-stream-bursty":  {lab.CSlowFiles, lab.KMmapBurst, lab.StartOnset},
		"datanode-slow-dir":   {lab.CSlowFiles, lab.KDataNode, lab.KSendfile, "afresh"},
	}
	for _, s := range lab.Named() {
		require.NoError(t, s.Validate())
		cls := s.Classes()
		for _, c := range want[s.Name] {
			assert.Contains(t, cls, c, "named scenario %s", s.Name)
		}
		delete(want, s.Name)
	}
	assert.Empty(t, want, "named scenarios missing")
}
