package probe

import (
	"regexp"
	"strconv"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/stretchr/testify/require"
)

// TestCompletionProgramVerifierWork: the verifier's work on the completion
// program grows with the CPUs it sums over, not with MAX_CPUS. Each start of
// the daemon (and so every slowdown it did not see begin) waits for it: a
// loop the verifier could not bound walked all 1024 iterations, 197k
// instructions and 0.2 s of every start.
func TestCompletionProgramVerifierWork(t *testing.T) {
	needRoot(t, "loads BPF programs")
	spec, err := Config{RingBytes: 1 << 20, FileEntries: 1024}.spec()
	require.NoError(t, err)
	cpus, err := ebpf.PossibleCPU()
	require.NoError(t, err)
	progs := map[string]*ebpf.ProgramSpec{"block_rq_complete": spec.Programs["block_rq_complete"]}
	coll, err := ebpf.NewCollectionWithOptions(&ebpf.CollectionSpec{Maps: spec.Maps, Programs: progs, Types: spec.Types, Variables: spec.Variables},
		ebpf.CollectionOptions{Programs: ebpf.ProgramOptions{LogLevel: ebpf.LogLevelStats}})
	require.NoError(t, err)
	defer coll.Close()
	log := coll.Programs["block_rq_complete"].VerifierLog
	m := regexp.MustCompile(`processed (\d+) insns`).FindStringSubmatch(log)
	require.NotNil(t, m, "no instruction count in the verifier's log: %s", log)
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	t.Logf("%d possible CPUs: %s", cpus, log)
	// About 200 instructions per CPU in each of the three per-CPU loops,
	// and the rest of the program.
	require.Less(t, n, 30000+3*400*min(cpus, maxCPUs), "the verifier walked more than the possible CPUs")
}
