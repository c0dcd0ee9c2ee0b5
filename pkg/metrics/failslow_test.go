package metrics

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/failslow"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// failSlowSources: three watched disks; sdb named slow against its peers,
// sdc healthy, sdd not read (no verdict), and a file of sdc slower than
// its disk, one with a path under the allow-paths and one without.
func failSlowSources() Sources {
	sdb, sdc, sdd := probe.MkDev(8, 16), probe.MkDev(8, 32), probe.MkDev(8, 48)
	names := map[probe.Dev]string{sdb: "sdb", sdc: "sdc", sdd: "sdd"}
	return Sources{
		Tuner: func() TunerStatus {
			return TunerStatus{Devices: []DeviceState{{Name: "sdb", Dev: "8:16"}, {Name: "sdc", Dev: "8:32"}, {Name: "sdd", Dev: "8:48"}}}
		},
		Detector: func() (detector.Snapshot, bool) { return detector.Snapshot{Now: 100 * time.Second}, true },
		FailSlow: func() []failslow.Disk {
			return []failslow.Disk{
				{Device: sdb, Ratio: 3.1, Held: 2.9, Reference: failslow.Peers, Requests: 300, Over: 14, Slow: true, Since: 90 * time.Second},
				{Device: sdc, Ratio: 0.4, Held: 0.35, Reference: failslow.Peers, Requests: 280, SlowFiles: []failslow.File{
					{Key: probe.FileKey{Dev: sdc, Ino: 12}, Ratio: 3.3, Requests: 120, Since: 95 * time.Second},
					{Key: probe.FileKey{Dev: sdc, Ino: 13}, Ratio: 1.8, Requests: 40, Since: 97 * time.Second},
				}},
				{Device: sdd, Reference: failslow.None},
			}
		},
		DeviceName: func(d probe.Dev) string { return names[d] },
		FilePath: func(k probe.FileKey) string {
			if k.Ino == 12 {
				return "/data/dn/current/blk_12"
			}
			return ""
		},
	}
}

func TestFailSlowExposition(t *testing.T) {
	c := NewCollector(failSlowSources())
	want := `
# HELP readaheadd_disk_slow 1 while the disk is named fail-slow: its read latency has stayed at or above the threshold times its reference's (readaheadd_disk_slow_ratio) for the hold time, else 0.
# TYPE readaheadd_disk_slow gauge
readaheadd_disk_slow{device="sdb"} 1
readaheadd_disk_slow{device="sdc"} 0
readaheadd_disk_slow{device="sdd"} 0
# HELP readaheadd_disk_slow_files Files on the disk named slower than the rest of the disk at the same request size over the same window (readaheadd status names them).
# TYPE readaheadd_disk_slow_files gauge
readaheadd_disk_slow_files{device="sdb"} 0
readaheadd_disk_slow_files{device="sdc"} 2
readaheadd_disk_slow_files{device="sdd"} 0
`
	require.NoError(t, testutil.CollectAndCompare(c, strings.NewReader(want), "readaheadd_disk_slow", "readaheadd_disk_slow_files"))
	got := series(t, c, "readaheadd_disk_slow_ratio")
	assert.Equal(t, map[string]float64{"device=sdb,reference=peers": 2.9, "device=sdc,reference=peers": 0.35}, got,
		"the held ratio with its reference; no series for a disk without a verdict")
	problems, err := testutil.CollectAndLint(c, "readaheadd_disk_slow", "readaheadd_disk_slow_ratio", "readaheadd_disk_slow_files")
	require.NoError(t, err)
	assert.Empty(t, problems)
}

func TestFailSlowAbsentWithoutSource(t *testing.T) {
	src := failSlowSources()
	src.FailSlow = nil
	c := NewCollector(src)
	assert.Zero(t, testutil.CollectAndCount(c, "readaheadd_disk_slow", "readaheadd_disk_slow_ratio", "readaheadd_disk_slow_files"))
}

func TestFailSlowStatus(t *testing.T) {
	s := NewServer(failSlowSources(), NewRegistry(failSlowSources()), nil, "v1", nil)
	rec := httptest.NewRecorder()
	s.Handler().ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/debug/status", nil))
	require.Equal(t, http.StatusOK, rec.Code)
	var st Status
	require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &st))
	require.Len(t, st.FailSlow, 2, "disks with a verdict; sdd has none")
	b := st.FailSlow[0]
	assert.Equal(t, "sdb", b.Device)
	assert.True(t, b.Slow)
	assert.Equal(t, 2.9, b.HeldRatio)
	assert.Equal(t, "peers", b.Reference)
	assert.Equal(t, 10.0, b.ForSeconds)
	c := st.FailSlow[1]
	require.Len(t, c.SlowFiles, 2)
	assert.Equal(t, "/data/dn/current/blk_12", c.SlowFiles[0].File, "a path under the allow-paths")
	assert.Equal(t, "8:32/13", c.SlowFiles[1].File, "no path: device:inode")
	assert.Equal(t, 5.0, c.SlowFiles[0].ForSeconds)
}
