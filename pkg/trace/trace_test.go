package trace

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

func TestPercentile(t *testing.T) {
	assert.Equal(t, time.Duration(0), Percentile(nil, 0.99))
	var ds []time.Duration
	for i := 1; i <= 100; i++ {
		ds = append(ds, time.Duration(101-i)*time.Millisecond)
	}
	assert.Equal(t, 99*time.Millisecond, Percentile(ds, 0.99))
	assert.Equal(t, 50*time.Millisecond, Percentile(ds, 0.5))
	assert.Equal(t, 1*time.Millisecond, Percentile(ds, 0))
	assert.Equal(t, 100*time.Millisecond, Percentile(ds, 1))
}

func TestWindowTopFilesAndDevices(t *testing.T) {
	d := probe.MkDev(7, 3)
	a, b := probe.FileKey{Dev: d, Ino: 12}, probe.FileKey{Dev: d, Ino: 13}
	t0 := time.Unix(1000, 0)
	w := NewWindow(t0)
	w.Names = func(x probe.Dev) string {
		if x == d {
			return "loop3"
		}
		return ""
	}
	for i := 0; i < 99; i++ {
		w.HandleRecord(probe.Record{Device: d, Bytes: 131072, Latency: time.Millisecond, Depth: 2, Kind: probe.KindFile, File: b})
	}
	w.HandleRecord(probe.Record{Device: d, Bytes: 131072, Latency: 50 * time.Millisecond, Depth: 4, Kind: probe.KindFile, File: b})
	w.HandleRecord(probe.Record{Device: d, Bytes: 4096, Latency: 2 * time.Millisecond, Depth: 1, Kind: probe.KindFile, File: a})
	w.HandleRecord(probe.Record{Device: d, Bytes: 4096, Latency: 100 * time.Microsecond, Depth: 1, Kind: probe.KindMeta})
	w.HandleReadahead(probe.ReadaheadEvent{Tgid: 42, Comm: "dd", File: b})
	w.HandleReadahead(probe.ReadaheadEvent{Tgid: 42, Comm: "dd", File: b})
	w.HandleReadahead(probe.ReadaheadEvent{Tgid: 43, Comm: "java", File: b})

	rep := w.Flush(t0.Add(time.Second), 1)
	require.Len(t, rep.Files, 1)
	f := rep.Files[0]
	assert.Equal(t, b, f.File)
	assert.Equal(t, "loop3", f.DiskName)
	assert.Equal(t, uint64(100*131072), f.Bytes)
	assert.Equal(t, uint64(100), f.Requests)
	assert.Equal(t, time.Millisecond+490*time.Microsecond, f.MeanLat)
	assert.Equal(t, time.Millisecond, f.P99Lat) // 99th of 100: the 99 fast ones
	assert.InDelta(t, 2.02, f.MeanDepth, 1e-9)
	assert.InDelta(t, 131072, f.MeanSize, 1e-9)
	assert.Equal(t, []Reader{{42, "dd"}, {43, "java"}}, f.Readers)

	require.Len(t, rep.Devices, 1)
	dv := rep.Devices[0]
	assert.Equal(t, uint64(102), dv.Requests)
	assert.Equal(t, uint64(1), dv.Other)
	assert.Equal(t, "7:3", dv.DevID)

	// The next window starts empty.
	next := w.Flush(t0.Add(2*time.Second), 0)
	assert.Empty(t, next.Files)
	assert.Empty(t, next.Devices)
	assert.Equal(t, t0.Add(time.Second), next.Start)

	var buf bytes.Buffer
	require.NoError(t, WriteJSON(&buf, rep))
	var back map[string]any
	require.NoError(t, json.Unmarshal(buf.Bytes(), &back))
	files := back["files"].([]any)
	require.Len(t, files, 1)
	assert.Equal(t, "7:3/13", files[0].(map[string]any)["file"])
	assert.InDelta(t, 1.49, files[0].(map[string]any)["mean_latency_ms"], 1e-9)

	buf.Reset()
	require.NoError(t, WriteText(&buf, rep))
	out := buf.String()
	assert.Contains(t, out, "loop3")
	assert.Contains(t, out, "42/dd+1")
	assert.Contains(t, out, "12.5M")                  // 12.5 MiB/s over one second
	assert.Equal(t, 6, strings.Count(out, "\n"), out) // title, two tables of header+row, blank
}

func TestReservoirBoundsSamples(t *testing.T) {
	w := NewWindow(time.Unix(0, 0))
	k := probe.FileKey{Dev: 1, Ino: 1}
	for i := 0; i < 3*maxSamples; i++ {
		w.HandleRecord(probe.Record{Device: 1, Bytes: 1, Latency: time.Duration(i), Kind: probe.KindFile, File: k})
	}
	assert.Len(t, w.files[k].samples, maxSamples)
	rep := w.Flush(time.Unix(1, 0), 0)
	// A uniform sample of 0..3N-1: its p99 is near the top.
	assert.Greater(t, rep.Files[0].P99Lat, time.Duration(3*maxSamples*95/100))
}
