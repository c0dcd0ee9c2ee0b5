package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
)

// fakeSys builds /sys/block with the given disks (name -> "maj:min").
func fakeSys(t *testing.T, disks map[string]string) blockdev.SysFS {
	t.Helper()
	root := t.TempDir()
	for name, dev := range disks {
		dir := filepath.Join(root, "block", name, "queue")
		require.NoError(t, os.MkdirAll(dir, 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, "block", name, "dev"), []byte(dev+"\n"), 0o644))
		require.NoError(t, os.WriteFile(filepath.Join(dir, "read_ahead_kb"), []byte("128\n"), 0o644))
	}
	return blockdev.SysFS{Root: root}
}

func validBase(t *testing.T) Config {
	c := Default()
	c.StateDir = filepath.Join(t.TempDir(), "state")
	return c
}

func TestDefaultsAreTheContract(t *testing.T) {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	f := AddFlags(fs)
	require.NoError(t, fs.Parse(nil))
	c, err := f.Config()
	require.NoError(t, err)
	assert.Equal(t, "127.0.0.1:9477", c.MetricsAddr)
	assert.Equal(t, "/var/lib/readaheadd", c.StateDir)
	assert.Equal(t, 4096, c.MaxReadAheadKB)
	assert.Equal(t, Duration(time.Second), c.Interval)
	assert.False(t, c.DryRun)
	assert.Empty(t, c.Devices)
	assert.Empty(t, c.AllowPaths)
	assert.Equal(t, 10, c.Nice)
	for _, name := range []string{"device", "allow-path", "metrics-addr", "state-dir", "max-read-ahead-kb", "dry-run", "interval", "log-format", "log-level", "nice", "config"} {
		assert.NotNil(t, fs.Lookup(name), "flag --%s", name)
	}
}

func TestFlagsWinOverFile(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "c.yaml")
	require.NoError(t, os.WriteFile(file, []byte(`
device: [sda, sdb]
allow-path: [/data]
metrics-addr: "127.0.0.1:1"
max-read-ahead-kb: 2048
interval: 2s
dry-run: true
log-format: json
`), 0o644))
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	f := AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--config", file, "--device", "sdc", "--interval", "500ms", "--metrics-addr", ""}))
	c, err := f.Config()
	require.NoError(t, err)
	assert.Equal(t, []string{"sdc"}, c.Devices, "flag wins")
	assert.Equal(t, []string{"/data"}, c.AllowPaths, "file value kept")
	assert.Equal(t, "", c.MetricsAddr, "an explicit empty flag disables metrics")
	assert.Equal(t, 2048, c.MaxReadAheadKB)
	assert.Equal(t, Duration(500*time.Millisecond), c.Interval)
	assert.True(t, c.DryRun)
	assert.Equal(t, "json", c.LogFormat)
	assert.Equal(t, "/var/lib/readaheadd", c.StateDir, "default kept")
}

func TestParseErrors(t *testing.T) {
	for name, tc := range map[string]struct{ yaml, want string }{
		"unknown key":    {"devices: [sda]\n", `unknown field "devices"`},
		"misspelt key":   {"metric-addr: x\n", `unknown field "metric-addr"`},
		"malformed":      {"device: [sda\n", "yaml"},
		"wrong type":     {"max-read-ahead-kb: lots\n", "max-read-ahead-kb"},
		"bad duration":   {"interval: soon\n", `invalid duration "soon"`},
		"number as dur":  {"interval: 5\n", "duration must be a string"},
		"duplicate keys": {"dry-run: true\ndry-run: false\n", "dry-run"},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Parse([]byte(tc.yaml), Default())
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "\n", "one line")
		})
	}
}

func TestLoadFileMissing(t *testing.T) {
	_, err := LoadFile(filepath.Join(t.TempDir(), "nope.yaml"), Default())
	require.Error(t, err)
	assert.Contains(t, err.Error(), "no such file")
}

func TestValidateOK(t *testing.T) {
	sys := fakeSys(t, map[string]string{"sda": "8:0", "loop0": "7:0", "vdb": "254:16"})
	allow := t.TempDir()
	link := filepath.Join(t.TempDir(), "link")
	require.NoError(t, os.Symlink(allow, link))

	c := validBase(t)
	c.AllowPaths = []string{link + "/"}
	v, err := Validate(c, sys)
	require.NoError(t, err)
	assert.Equal(t, []string{"sda", "vdb"}, v.Devices, "default: every disk but loop, ram, zram")
	real, _ := filepath.EvalSymlinks(allow)
	assert.Equal(t, []string{real}, v.AllowPaths, "symlinks resolved, cleaned")
	assert.Equal(t, time.Second, v.Interval)

	c.Devices = []string{"loop0", "loop0"}
	v, err = Validate(c, sys)
	require.NoError(t, err)
	require.Len(t, v.Disks, 1)
	assert.Equal(t, "7:0", v.Disks[0].Dev.String())
}

func TestValidateErrors(t *testing.T) {
	sys := fakeSys(t, map[string]string{"sda": "8:0"})
	file := filepath.Join(t.TempDir(), "f")
	require.NoError(t, os.WriteFile(file, nil, 0o644))
	for name, tc := range map[string]struct {
		mod  func(*Config)
		want string
	}{
		"negative size":      {func(c *Config) { c.MaxReadAheadKB = -1 }, "max-read-ahead-kb -1 is out of range"},
		"zero size":          {func(c *Config) { c.MaxReadAheadKB = 0 }, "max-read-ahead-kb 0 is out of range"},
		"absurd size":        {func(c *Config) { c.MaxReadAheadKB = 1 << 30 }, "out of range"},
		"interval too short": {func(c *Config) { c.Interval = Duration(time.Millisecond) }, "interval 1ms is out of range"},
		"interval too long":  {func(c *Config) { c.Interval = Duration(time.Hour) }, "interval 1h0m0s is out of range"},
		"negative interval":  {func(c *Config) { c.Interval = Duration(-time.Second) }, "out of range"},
		"log format":         {func(c *Config) { c.LogFormat = "xml" }, `log-format "xml"`},
		"log level":          {func(c *Config) { c.LogLevel = "loud" }, `log-level "loud"`},
		"negative nice":      {func(c *Config) { c.Nice = -5 }, "nice -5 is out of range: give 0..19"},
		"nice past 19":       {func(c *Config) { c.Nice = 20 }, "nice 20 is out of range"},
		"metrics no port":    {func(c *Config) { c.MetricsAddr = "localhost" }, "is not HOST:PORT"},
		"metrics bad port":   {func(c *Config) { c.MetricsAddr = "127.0.0.1:http" }, `port "http"`},
		"metrics big port":   {func(c *Config) { c.MetricsAddr = "127.0.0.1:70000" }, `port "70000"`},
		"metrics bad host":   {func(c *Config) { c.MetricsAddr = "a b:80" }, `host "a b"`},
		"state dir relative": {func(c *Config) { c.StateDir = "state" }, `state-dir "state" is not an absolute path`},
		"state dir a file":   {func(c *Config) { c.StateDir = file }, "is not a directory"},
		"device slash":       {func(c *Config) { c.Devices = []string{"../sda"} }, "invalid block device name"},
		"device dotdot":      {func(c *Config) { c.Devices = []string{".."} }, "invalid block device name"},
		"device empty":       {func(c *Config) { c.Devices = []string{""} }, "invalid block device name"},
		"device missing":     {func(c *Config) { c.Devices = []string{"sdz"} }, `block device "sdz": no such block device`},
		"allow relative":     {func(c *Config) { c.AllowPaths = []string{"data"} }, `allow-path "data" is not an absolute path`},
		"allow missing":      {func(c *Config) { c.AllowPaths = []string{"/nonexistent/readaheadd"} }, "allow-path /nonexistent/readaheadd does not exist"},
		"allow device":       {func(c *Config) { c.AllowPaths = []string{"/dev/null"} }, "is not a directory"},
		"allow regular file": {func(c *Config) { c.AllowPaths = []string{file} }, "allow-path " + file + " is not a directory"},
		"allow root":         {func(c *Config) { c.AllowPaths = []string{"/"} }, "set allow-root-fs to mean it"},
		"allow root dotdot":  {func(c *Config) { c.AllowPaths = []string{"/tmp/.."} }, "whole root filesystem"},
	} {
		t.Run(name, func(t *testing.T) {
			c := validBase(t)
			tc.mod(&c)
			_, err := Validate(c, sys)
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
			assert.NotContains(t, err.Error(), "\n")
			_, statErr := os.Stat(c.StateDir)
			if c.StateDir != file && filepath.IsAbs(c.StateDir) {
				assert.True(t, os.IsNotExist(statErr), "validation must not create the state dir")
			}
		})
	}
}

func TestValidateNoDefaultDisk(t *testing.T) {
	sys := fakeSys(t, map[string]string{"loop0": "7:0", "zram0": "252:0"})
	_, err := Validate(validBase(t), sys)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "give --device")
}

func TestMetricsAddrForms(t *testing.T) {
	for _, ok := range []string{"", "127.0.0.1:9477", ":9477", "[::1]:9477", "localhost:0", "node-1.example:9477"} {
		assert.NoError(t, validateAddr(ok), ok)
	}
}

func TestDurationRoundTrip(t *testing.T) {
	b, err := Duration(1500 * time.Millisecond).MarshalJSON()
	require.NoError(t, err)
	var d Duration
	require.NoError(t, d.UnmarshalJSON(b))
	assert.Equal(t, Duration(1500*time.Millisecond), d)
	assert.True(t, strings.Contains(string(b), "1.5s"))
}

// osDiskSys is a sysfs tree in which vda (with partition vda1 holding the
// root filesystem), sdb, and loop0 exist.
func osDiskSys(t *testing.T) blockdev.SysFS {
	sys := fakeSys(t, map[string]string{"vda": "254:0", "sdb": "8:16", "loop0": "7:0"})
	part := filepath.Join(sys.Root, "block", "vda", "vda1")
	require.NoError(t, os.MkdirAll(part, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(part, "partition"), []byte("1\n"), 0o644))
	require.NoError(t, os.MkdirAll(filepath.Join(sys.Root, "dev", "block"), 0o755))
	require.NoError(t, os.Symlink(part, filepath.Join(sys.Root, "dev", "block", "254:1")))
	old := rootFSDev
	rootFSDev = func() (uint64, error) { return unix.Mkdev(254, 1), nil }
	t.Cleanup(func() { rootFSDev = old })
	return sys
}

func TestOSDiskOnlyWithExplicitWord(t *testing.T) {
	sys := osDiskSys(t)
	c := validBase(t)
	v, err := Validate(c, sys)
	require.NoError(t, err)
	assert.Equal(t, "vda", v.OSDisk)
	assert.Equal(t, []string{"sdb"}, v.Devices, "default: the OS disk is left out")

	c.Devices = []string{"vda"}
	_, err = Validate(c, sys)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "holds the root filesystem")
	assert.Contains(t, err.Error(), "allow-os-disk")

	c.AllowOSDisk = true
	v, err = Validate(c, sys)
	require.NoError(t, err)
	assert.Equal(t, []string{"vda"}, v.Devices)

	c.Devices = nil
	v, err = Validate(c, sys)
	require.NoError(t, err)
	assert.Equal(t, []string{"sdb", "vda"}, v.Devices, "default with allow-os-disk: every non-virtual disk")
}

func TestOnlyOSDiskMeansNoDefault(t *testing.T) {
	sys := osDiskSys(t)
	require.NoError(t, os.RemoveAll(filepath.Join(sys.Root, "block", "sdb")))
	_, err := Validate(validBase(t), sys)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "give --device")
	assert.Contains(t, err.Error(), "root filesystem")
}

func TestAllowRootFSWithExplicitWord(t *testing.T) {
	sys := fakeSys(t, map[string]string{"sdb": "8:16"})
	c := validBase(t)
	c.AllowPaths = []string{"/"}
	c.AllowRootFS = true
	v, err := Validate(c, sys)
	require.NoError(t, err)
	assert.Equal(t, []string{"/"}, v.AllowPaths)

	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	f := AddFlags(fs)
	require.NoError(t, fs.Parse([]string{"--allow-root-fs", "--allow-os-disk"}))
	c, err = f.Config()
	require.NoError(t, err)
	assert.True(t, c.AllowRootFS)
	assert.True(t, c.AllowOSDisk)
	c, err = Parse([]byte("allow-os-disk: true\nallow-root-fs: true\n"), Default())
	require.NoError(t, err)
	assert.True(t, c.AllowRootFS && c.AllowOSDisk)
}
