package reliability

import (
	"go/parser"
	"go/token"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The daemon runs no external commands: no non-test Go file under cmd/
// or pkg/ imports os/exec (or syscall's exec).
func TestNoExecInDaemonSources(t *testing.T) {
	var checked int
	for _, root := range []string{"../../cmd", "../../pkg"} {
		require.NoError(t, filepath.WalkDir(root, func(p string, e fs.DirEntry, err error) error {
			if err != nil || e.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
				return err
			}
			f, err := parser.ParseFile(token.NewFileSet(), p, nil, parser.ImportsOnly)
			require.NoError(t, err)
			checked++
			for _, im := range f.Imports {
				path, _ := strconv.Unquote(im.Path.Value)
				assert.NotEqual(t, "os/exec", path, "%s imports os/exec: the daemon must not run commands", p)
			}
			b, err := os.ReadFile(p)
			require.NoError(t, err)
			for _, call := range []string{"syscall.Exec(", "unix.Exec(", "syscall.ForkExec(", "os.StartProcess("} {
				assert.NotContains(t, string(b), call, "%s runs a program", p)
			}
			return nil
		}))
	}
	assert.Greater(t, checked, 20, "walked the sources")
}

// The HTTP endpoints are read-only and bind to loopback by default.
func TestEndpointsReadOnlyAndLoopbackByDefault(t *testing.T) {
	requireRoot(t, "BPF")
	ld := newLoop(t, 16)
	d := startDaemon(t, "--device", ld.Name, "--state-dir", filepath.Join(t.TempDir(), "state"))
	for _, path := range []string{"/metrics", "/healthz", "/debug/status", "/debug/files"} {
		for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
			req, err := http.NewRequest(m, "http://"+d.Addr+path, strings.NewReader("x=1"))
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			resp.Body.Close()
			assert.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode, "%s %s", m, path)
		}
		code, _, err := d.get(path)
		require.NoError(t, err)
		assert.Contains(t, []int{200, 503}, code, "GET %s", path)
	}
	assert.Equal(t, 0, d.stop(t))

	// The default address, from the help text the binary prints.
	r := runBin(t, nil, "run", "--help")
	assert.Contains(t, r.stdout, `"127.0.0.1:9477"`)
}

// The systemd unit grants exactly what `check` proves needed: with the
// unit's set `check` passes without a warning, and with any one of them
// dropped it fails or warns naming it.
func TestUnitCapabilitiesAreWhatCheckNeeds(t *testing.T) {
	requireRoot(t, "setpriv and BPF")
	b, err := os.ReadFile("../../deploy/systemd/readaheadd.service")
	require.NoError(t, err)
	var caps []string
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "CapabilityBoundingSet="); ok {
			for _, c := range strings.Fields(v) {
				caps = append(caps, strings.ToLower(strings.TrimPrefix(c, "CAP_")))
			}
		}
	}
	require.NotEmpty(t, caps)
	ld := newLoop(t, 16)
	with := func(set []string) result {
		var plus []string
		for _, c := range set {
			plus = append(plus, "+"+c)
		}
		w := []string{"setpriv", "--bounding-set=-all," + strings.Join(plus, ","), "--inh-caps=-all", "--"}
		return runBin(t, w, "check", "--device", ld.Name)
	}
	r := with(caps)
	assert.Equal(t, 0, r.code, r.stdout)
	assert.NotContains(t, r.stdout, "warn ")
	assert.NotContains(t, r.stdout, "FAIL")
	for i, c := range caps {
		rest := append(append([]string(nil), caps[:i]...), caps[i+1:]...)
		r := with(rest)
		name := "CAP_" + strings.ToUpper(c)
		assert.Regexp(t, `(?m)^(FAIL|warn) .*`+name, r.stdout, "without %s check must say it is needed", name)
		t.Logf("without %s: exit %d; %s", name, r.code, firstLineWith(r.stdout, name))
	}
}

func firstLineWith(s, sub string) string {
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) && (strings.HasPrefix(l, "FAIL") || strings.HasPrefix(l, "warn")) {
			return l
		}
	}
	return ""
}
