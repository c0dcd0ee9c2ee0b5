package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/readaheadd/readaheadd/pkg/metrics"
)

func TestStatusSummary(t *testing.T) {
	st := metrics.Status{
		Version: "v1", StartedAt: time.Now().Add(-90 * time.Second), Healthy: true, ProbeAttached: true, EventsLost: 3,
		Devices: []metrics.DeviceStatus{{DeviceState: metrics.DeviceState{Name: "sdb", Dev: "8:16", ReadAheadKB: 128, OriginalKB: 128, FilesAdjusted: 1}, Requests: 900, P50ms: 4.2, P99ms: 9.8}},
		Regimes: []metrics.RegimeStatus{{Kind: "file_latency_shift", Device: "sdb", File: "/data/dn/blk_1", ForSeconds: 12, Confidence: 0.97, Evidence: "median 2.6x baseline"},
			{Kind: "tail_inflation", Device: "sdb", DeviceWide: true, ForSeconds: 3, Confidence: 0.8}},
		RecentActions: []metrics.Action{{Time: time.Now(), Device: "sdb", Action: "file_window", Target: "/data/dn/blk_1", FromKB: 128, ToKB: 512, Result: "kept", Effect: "+43%"}},
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		require.Equal(t, "/debug/status", r.URL.Path)
		require.NoError(t, json.NewEncoder(w).Encode(st))
	}))
	defer srv.Close()

	got, err := fetchStatus(context.Background(), strings.TrimPrefix(srv.URL, "http://"))
	require.NoError(t, err)
	var out bytes.Buffer
	printStatus(&out, got)
	s := out.String()
	for _, want := range []string{
		"readaheadd v1, up 1m30s, healthy", "events lost: 3",
		"sdb     8:16  128            128          1               900       4.20    9.80",
		"file_latency_shift  sdb     /data/dn/blk_1  12s  0.97        median 2.6x baseline",
		"tail_inflation      sdb     (whole device)",
		"file_window  /data/dn/blk_1  128 -> 512  kept    +43%",
	} {
		assert.Contains(t, s, want)
	}
	assert.NotContains(t, s, "above their device's window", "nothing said without the kernel's per-file state")

	// With the kernel's per-file state: the files above their device's
	// window are named, or said to be none.
	st.OpenFileWindows = []metrics.OpenWindows{{Device: "sdb", WindowKB: 128, Files: 4}}
	out.Reset()
	printStatus(&out, st)
	assert.Contains(t, out.String(), "open files above their device's window: none")
	st.OpenFilesAbove = []metrics.OpenFileAbove{{Device: "sdb", DeviceKB: 128, PID: 42, FD: 7, Path: "/data/dn/blk_1", RAPagesKB: 128, StreamKB: 2048}}
	out.Reset()
	printStatus(&out, st)
	assert.Contains(t, out.String(), "sdb     128        42   7   128          2048       /data/dn/blk_1")
}

func TestStatusErrors(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "nope", http.StatusServiceUnavailable)
	}))
	defer srv.Close()
	_, err := fetchStatus(context.Background(), srv.URL)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "503")

	notJSON := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.Write([]byte("<html>")) }))
	defer notJSON.Close()
	_, err = fetchStatus(context.Background(), notJSON.URL)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "is not readaheadd's")
}
