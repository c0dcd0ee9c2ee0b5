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

	"github.com/readaheadd/readaheadd/pkg/probe"
)

func statusFile(t *testing.T, capEff uint64) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "status")
	require.NoError(t, os.WriteFile(p, []byte(fmt.Sprintf("Name:\treadaheadd\nCapInh:\t0000000000000000\nCapEff:\t%016x\nCapBnd:\t000001ffffffffff\n", capEff)), 0o644))
	return p
}

func allProgs() probe.CheckReport {
	var r probe.CheckReport
	for _, n := range []string{"block_rq_complete", "block_rq_issue", "page_cache_async_ra", "page_cache_sync_ra"} {
		r.Programs = append(r.Programs, probe.ProgramCheck{Name: n, Attach: "tp_btf/" + n, Loaded: true, Attached: true})
	}
	return r
}

func TestEffectiveCaps(t *testing.T) {
	c, err := effectiveCaps(statusFile(t, 1<<capBPF|1<<capSysPtrace))
	require.NoError(t, err)
	assert.Equal(t, uint64(1<<capBPF|1<<capSysPtrace), c)
	_, err = effectiveCaps(filepath.Join(t.TempDir(), "none"))
	assert.Error(t, err)
}

func TestCheckNamesMissingCapabilities(t *testing.T) {
	sys := fakeSysfs(t, map[string]int{"sdx": 128})
	all := uint64(1<<capBPF | 1<<capPerfmon | 1<<capSysAdmin | 1<<capSysPtrace | 1<<capDACReadSearch)

	var out bytes.Buffer
	c := &checker{w: &out, statusPath: statusFile(t, all), sys: sys, probeCheck: allProgs}
	require.NoError(t, c.run(), out.String())
	assert.Contains(t, out.String(), "readaheadd can run here")

	// Without CAP_BPF/CAP_PERFMON/CAP_SYS_ADMIN: a FAIL naming them, exit 1.
	out.Reset()
	c = &checker{w: &out, statusPath: statusFile(t, 1<<capSysPtrace|1<<capDACReadSearch), sys: sys,
		probeCheck: func() probe.CheckReport {
			r := allProgs()
			for i := range r.Programs {
				r.Programs[i].Loaded, r.Programs[i].Attached = false, false
				r.Programs[i].Err = errors.New("operation not permitted")
			}
			return r
		}}
	require.Error(t, c.run())
	assert.Contains(t, out.String(), "FAIL BPF tracing needs CAP_BPF and CAP_PERFMON")
	assert.Contains(t, out.String(), "FAIL BPF program block_rq_issue (tp_btf/block_rq_issue): loaded=false attached=false: operation not permitted")

	// Without CAP_SYS_PTRACE: a warning only (device-wide actions still work).
	out.Reset()
	c = &checker{w: &out, statusPath: statusFile(t, all&^(1<<capSysPtrace)), sys: sys, probeCheck: allProgs}
	require.NoError(t, c.run())
	assert.Contains(t, out.String(), "warn per-file actions need CAP_SYS_PTRACE")

	// A program that did not attach fails the check.
	out.Reset()
	c = &checker{w: &out, statusPath: statusFile(t, all), sys: sys, probeCheck: func() probe.CheckReport {
		r := allProgs()
		r.Programs[3].Attached = false
		r.Programs[3].Err = probe.ErrTracepointMissing
		return r
	}}
	require.Error(t, c.run())
	assert.Contains(t, out.String(), "FAIL BPF program page_cache_sync_ra (tp_btf/page_cache_sync_ra): loaded=true attached=false: the kernel lacks a tracepoint")

	// No BTF: said so, exit 1.
	out.Reset()
	c = &checker{w: &out, statusPath: statusFile(t, all), sys: sys, probeCheck: func() probe.CheckReport {
		return probe.CheckReport{BTF: probe.ErrNoBTF}
	}}
	require.Error(t, c.run())
	assert.Contains(t, out.String(), "FAIL kernel BTF: the kernel exposes no BTF")
}

func TestCheckSysfsNotWritable(t *testing.T) {
	if os.Geteuid() == 0 {
		t.Skip("root can write any file: the unwritable case needs a non-root user")
	}
	sys := fakeSysfs(t, map[string]int{"sdx": 128})
	require.NoError(t, os.Chmod(filepath.Join(sys.Root, "block", "sdx", "queue", "read_ahead_kb"), 0o444))
	var out bytes.Buffer
	c := &checker{w: &out, statusPath: statusFile(t, ^uint64(0)), sys: sys, probeCheck: allProgs}
	require.Error(t, c.run())
	assert.Contains(t, out.String(), "read_ahead_kb not writable")
}

func TestCheckWarnsInAPIDNamespaceOfItsOwn(t *testing.T) {
	sys := fakeSysfs(t, map[string]int{"sdx": 128})
	all := uint64(1<<capBPF | 1<<capPerfmon | 1<<capSysPtrace | 1<<capDACOverride)
	for _, c := range []struct {
		nspid, want string
	}{
		{"4242", "ok   host PID namespace"},
		{"4242\t7", "warn readaheadd runs in a PID namespace of its own (NSpid 4242\t7)"},
	} {
		p := filepath.Join(t.TempDir(), "status")
		require.NoError(t, os.WriteFile(p, []byte(fmt.Sprintf("Name:\treadaheadd\nNSpid:\t%s\nCapEff:\t%016x\n", c.nspid, all)), 0o644))
		var out bytes.Buffer
		ck := &checker{w: &out, statusPath: p, sys: sys, probeCheck: allProgs}
		require.NoError(t, ck.run(), "a warning, not a failure")
		assert.Contains(t, out.String(), c.want)
	}
}
