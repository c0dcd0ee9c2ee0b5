package nspawn

import (
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestAptMirrorBothForms(t *testing.T) {
	old := aptDir
	t.Cleanup(func() { aptDir = old })
	for _, c := range []struct {
		name, file, text, want string
	}{
		{"deb822", "sources.list.d/debian.sources",
			"Types: deb\n# comment\nURIs: http://security.example/debian-security\nSuites: bookworm-security\nComponents: main\n\n" +
				"Types: deb deb-src\nURIs: http://mirror.example/debian\nSuites: bookworm bookworm-updates\nComponents: main\n",
			"http://mirror.example/debian"},
		{"one-line", "sources.list",
			"# deb http://old.example/debian bookworm main\ndeb [broken\ndeb-src http://src.example/debian bookworm main\n" +
				"deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main\n",
			"http://mirror.example/debian"},
	} {
		t.Run(c.name, func(t *testing.T) {
			aptDir = t.TempDir()
			require.NoError(t, os.MkdirAll(filepath.Join(aptDir, "sources.list.d"), 0o755))
			require.NoError(t, os.WriteFile(filepath.Join(aptDir, c.file), []byte(c.text), 0o644))
			got, err := aptMirror("bookworm")
			require.NoError(t, err)
			assert.Equal(t, c.want, got)
			_, err = aptMirror("trixie")
			assert.ErrorContains(t, err, "READAHEADD_NSPAWN_MIRROR")
		})
	}
}

func TestMirrorAnswersOrSaysWhy(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/debian/dists/"+Suite+"/Release" {
			w.Write([]byte("Suite: stable\n"))
			return
		}
		http.NotFound(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Setenv("READAHEADD_NSPAWN_MIRROR", srv.URL+"/debian/")
	m, err := Mirror()
	require.NoError(t, err)
	assert.Equal(t, srv.URL+"/debian", m)

	t.Setenv("READAHEADD_NSPAWN_MIRROR", srv.URL+"/ubuntu")
	_, err = Mirror()
	assert.ErrorContains(t, err, "404")

	srv.Close()
	t.Setenv("READAHEADD_NSPAWN_MIRROR", srv.URL+"/debian")
	_, err = Mirror()
	assert.ErrorContains(t, err, "not reachable")
}
