package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func statusFile(t *testing.T, capEff uint64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "status")
	require.NoError(t, os.WriteFile(p, []byte(fmt.Sprintf("Name:\treadaheadd\nCapInh:\t0000000000000000\nCapEff:\t%016x\nCapBnd:\t000001ffffffffff\n", capEff)), 0o644))
	return p
}

func allProgs() (map[string]bool, error) {
	return map[string]bool{"block_rq_issue": true, "block_rq_complete": true, "page_cache_sync_ra": true, "page_cache_async_ra": true}, nil
}

func TestEffectiveCaps(t *testing.T) {
	c, err := effectiveCaps(statusFile(t, 1<<capBPF|1<<capSysPtrace))
	require.NoError(t, err)
	assert.Equal(t, uint64(1<<capBPF|1<<capSysPtrace), c)
	_, err = effectiveCaps(filepath.Join(t.TempDir(), "none"))
	assert.Error(t, err)
}

func TestCheckNamesMissingCapabilities(t *testing.T) {
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		t.Skip("no kernel BTF on this machine")
	}
	sys := fakeSysfs(t, map[string]int{"sdx": 128})
	all := uint64(1<<capBPF | 1<<capPerfmon | 1<<capSysAdmin | 1<<capSysResource | 1<<capSysPtrace | 1<<capDACOverride)

	var out bytes.Buffer
	c := &checker{w: &out, statusPath: statusFile(t, all), sys: sys, loadProbe: allProgs}
	require.NoError(t, c.run(), out.String())
	assert.Contains(t, out.String(), "readaheadd can run here")

	// Without CAP_BPF/CAP_PERFMON/CAP_SYS_ADMIN: a FAIL naming them, exit 1.
	out.Reset()
	c = &checker{w: &out, statusPath: statusFile(t, 1<<capSysPtrace|1<<capDACOverride), sys: sys,
		loadProbe: func() (map[string]bool, error) { return nil, errors.New("operation not permitted") }}
	require.Error(t, c.run())
	assert.Contains(t, out.String(), "warn CAP_BPF missing")
	assert.Contains(t, out.String(), "FAIL BPF tracing needs CAP_BPF and CAP_PERFMON")
	assert.Contains(t, out.String(), "FAIL load and attach the BPF programs: operation not permitted")

	// Without CAP_SYS_PTRACE: a warning only (device-wide actions still work).
	out.Reset()
	c = &checker{w: &out, statusPath: statusFile(t, all&^(1<<capSysPtrace)), sys: sys, loadProbe: allProgs}
	require.NoError(t, c.run())
	assert.Contains(t, out.String(), "warn per-file actions need CAP_SYS_PTRACE")

	// A program that did not attach fails the check.
	out.Reset()
	c = &checker{w: &out, statusPath: statusFile(t, all), sys: sys, loadProbe: func() (map[string]bool, error) {
		return map[string]bool{"block_rq_issue": true, "block_rq_complete": true}, nil
	}}
	require.Error(t, c.run())
	assert.Contains(t, out.String(), "FAIL BPF program page_cache_sync_ra attached")
}

func TestCheckSysfsNotWritable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root can write any file: the unwritable case needs a non-root user")
	}
	sys := fakeSysfs(t, map[string]int{"sdx": 128})
	require.NoError(t, os.Chmod(filepath.Join(sys.Root, "block", "sdx", "queue", "read_ahead_kb"), 0o444))
	var out bytes.Buffer
	c := &checker{w: &out, statusPath: statusFile(t, ^uint64(0)), sys: sys, loadProbe: allProgs}
	require.Error(t, c.run())
	assert.Contains(t, out.String(), "read_ahead_kb not writable")
}
