package tuner

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/state"
)

// healthyTrials lists (and logs every action) the trials after at that an
// outcome decision took from the device's window: those a healthy stream
// at its device's bandwidth is given and its back-off repeats. (A host that
// starves the reader or the lab of CPU makes the detector enter regimes of
// its own now and then, and slows the stream below the device's bandwidth:
// a step of a stream reading under atBandwidth of it, 80 MB/s, is not this
// test's matter; one read 38.5 MB/s in a CI run, and was stepped.)
func healthyTrials(t *testing.T, acts []actionEntry, at time.Time) []actionEntry {
	const atBandwidth = 0.8 * 80
	var out []actionEntry
	for _, a := range acts {
		t.Logf("  %s %s %d->%d %s: %s", a.Time.Format("15:04:05.0"), a.Action, a.FromKB, a.ToKB, a.Result, a.Evidence)
		// A trial whose rate the evidence does not give counts.
		now := math.Inf(1)
		if i := strings.Index(a.Evidence, "; now "); i >= 0 {
			fmt.Sscanf(a.Evidence[i:], "; now %f MB/s", &now)
		}
		if a.Action == "file_window" && a.Result == "trial" && a.FromKB == 128 && a.Time.After(at) &&
			strings.HasPrefix(a.Evidence, "regimes [window_bound];") && now >= atBandwidth {
			out = append(out, a)
		}
	}
	return out
}

// TestNoTrialsOnceTheDeviceCapacityIsKnown: a healthy stream at its
// device's bandwidth (newBandwidthBoundLab: 80 MB/s at the default 128 KB)
// gets one trial, which raises the device's bytes in flight and not its
// throughput: the daemon learns the device's capacity from it, and tries
// the stream no more (the outcome back-off alone would try it again 2, 6
// and 14 s later: each trial a queue of 1 MB ahead of every other reader of
// the device). The capacity is saved with the priors, and a restarted
// daemon tries no stream at it at all, where without it the first trial
// comes within two seconds. Root, 30-50 s.
func TestNoTrialsOnceTheDeviceCapacityIsKnown(t *testing.T) {
	needRoot(t)
	l := newBandwidthBoundLab(t)
	target, err := l.WriteFile("blk_capacity", 1024)
	require.NoError(t, err)
	daemonBin(t)
	stateDir := filepath.Join(t.TempDir(), "state")
	d := runDaemon(t, l, stateDir)
	seq := startChild(t, "seq", target)
	seq.goRead(t)
	at := d.capacityLearned(t, 20*time.Second)
	// The back-off's next two trials would come 2 and 6 s later.
	time.Sleep(8 * time.Second)
	after := healthyTrials(t, d.actions(), at)
	t.Logf("outcome trials from the device's window in the 8 s after the capacity was learned: %d", len(after))
	assert.Empty(t, after, "no outcome trial of a stream at the capacity once it is known")
	assert.True(t, seq.alive())
	require.Equal(t, 0, d.signal(t, syscall.SIGTERM))

	b, err := os.ReadFile(filepath.Join(stateDir, state.PriorsName))
	require.NoError(t, err)
	var p struct {
		Devices []state.DeviceCapacity `json:"devices"`
	}
	require.NoError(t, json.Unmarshal(b, &p))
	require.Len(t, p.Devices, 1, "the capacity is saved with the priors: %s", b)
	assert.Equal(t, l.Name, p.Devices[0].Device)
	t.Logf("saved capacity: %.1f MB/s", p.Devices[0].CapacityBPS/1e6)
	assert.InDelta(t, 80, p.Devices[0].CapacityBPS/1e6, 20, "the device's bandwidth")

	// Restarted on the same state: the stream, read on, is not tried.
	d2 := runDaemon(t, l, stateDir)
	restart := time.Now()
	time.Sleep(6 * time.Second) // without the saved capacity, a trial within 2 s
	assert.Empty(t, healthyTrials(t, d2.actions(), restart), "no outcome trial after the restart")
	assert.Contains(t, d2.logs.String(), "capacities=1", "the restarted daemon loaded the capacity")
	assert.True(t, seq.alive())
	assert.Equal(t, 0, d2.signal(t, syscall.SIGTERM))
}
