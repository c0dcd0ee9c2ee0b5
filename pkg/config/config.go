// Package config holds the configuration of `readaheadd run`: its flags, the
// YAML file given with --config (same names as the flags; flags win), and the
// validation that must pass before the daemon changes anything on the machine.
package config

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/pflag"
	"golang.org/x/sys/unix"
	"sigs.k8s.io/yaml"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Defaults and bounds. The flag names and defaults are part of the
// command-line contract.
const (
	DefaultMetricsAddr    = "127.0.0.1:9477"
	DefaultStateDir       = "/var/lib/readaheadd"
	DefaultMaxReadAheadKB = 4096
	DefaultInterval       = time.Second

	// MinReadAheadKB..MaxReadAheadKBLimit bound --max-read-ahead-kb: one page,
	// and 1 GiB (far beyond any useful window; a typo guard).
	MinReadAheadKB      = 4
	MaxReadAheadKBLimit = 1 << 20

	// The control loop needs a few block requests per interval to measure
	// anything, and must react within a minute to be of use.
	MinInterval = 100 * time.Millisecond
	MaxInterval = time.Minute

	// DefaultNice: the daemon's work yields the CPU to the services it
	// tunes (docs/operations.md). MaxNice is the kernel's.
	DefaultNice = 10
	MaxNice     = 19
)

// DefaultDevicesRule is which disks are tuned when no device is given. It
// is stated once, here, for the flag's help, the shipped config.yaml and the
// docs (a deploy test checks config.yaml says the same).
const DefaultDevicesRule = "every disk in /sys/block except loop, ram, zram, nbd, dm-* and md devices, and except the disk that holds the root filesystem (the OS disk) unless allow-os-disk is set"

// Log formats.
const (
	LogText = "text"
	LogJSON = "json"
)

// Config is the configuration of `readaheadd run`. The JSON names are the
// YAML keys of the config file and equal the flag names.
type Config struct {
	Devices    []string `json:"device,omitempty"`
	AllowPaths []string `json:"allow-path,omitempty"`
	// AllowOSDisk lets readaheadd tune the disk that holds the root
	// filesystem, and AllowRootFS lets "/" be an allow-path: both reach
	// every service on the machine, so neither happens by default.
	AllowOSDisk    bool     `json:"allow-os-disk,omitempty"`
	AllowRootFS    bool     `json:"allow-root-fs,omitempty"`
	MetricsAddr    string   `json:"metrics-addr"`
	StateDir       string   `json:"state-dir"`
	MaxReadAheadKB int      `json:"max-read-ahead-kb"`
	DryRun         bool     `json:"dry-run"`
	Interval       Duration `json:"interval"`
	LogFormat      string   `json:"log-format"`
	LogLevel       string   `json:"log-level"`
	// Nice is the CPU niceness the daemon's threads run at (0 leaves them
	// as started): its bursts of work wait behind the services it tunes.
	Nice int `json:"nice"`
}

// Duration is a time.Duration written as "1s", "250ms" in YAML.
type Duration time.Duration

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("a duration must be a string such as \"1s\" or \"500ms\", not %s", b)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("invalid duration %q: use a number with a unit, such as \"1s\" or \"500ms\"", s)
	}
	*d = Duration(v)
	return nil
}

// Default returns the configuration used when nothing is given.
func Default() Config {
	return Config{
		MetricsAddr:    DefaultMetricsAddr,
		StateDir:       DefaultStateDir,
		MaxReadAheadKB: DefaultMaxReadAheadKB,
		Interval:       Duration(DefaultInterval),
		LogFormat:      LogText,
		LogLevel:       "info",
		Nice:           DefaultNice,
	}
}

// Parse reads a YAML config on top of base. Unknown keys, duplicate keys and
// values of the wrong type are errors.
func Parse(data []byte, base Config) (Config, error) {
	c := base
	if err := yaml.UnmarshalStrict(data, &c); err != nil {
		return Config{}, errors.New(oneLine(err.Error()))
	}
	return c, nil
}

// LoadFile reads the YAML config file at path on top of base.
func LoadFile(path string, base Config) (Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("config file: %w", err)
	}
	c, err := Parse(data, base)
	if err != nil {
		return Config{}, fmt.Errorf("config file %s: %w", path, err)
	}
	return c, nil
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}

// Flags binds the run flags to a flag set.
type Flags struct {
	fs         *pflag.FlagSet
	v          Config
	interval   time.Duration
	configPath string
}

// AddFlags registers the run flags (and --config) on fs.
func AddFlags(fs *pflag.FlagSet) *Flags {
	d := Default()
	f := &Flags{fs: fs}
	fs.StringVar(&f.configPath, "config", "", "YAML config file (keys are the flag names; flags given on the command line win)")
	AddDeviceFlags(fs, &f.v)
	fs.StringArrayVar(&f.v.AllowPaths, "allow-path", nil, "absolute directory whose files per-file actions may touch (repeatable; default: none, device-level actions only; / needs --allow-root-fs)")
	fs.BoolVar(&f.v.AllowRootFS, "allow-root-fs", false, "let --allow-path be / (every file of every service)")
	fs.StringVar(&f.v.MetricsAddr, "metrics-addr", d.MetricsAddr, "HOST:PORT for /metrics, /healthz and /debug/*; \"\" disables")
	fs.StringVar(&f.v.StateDir, "state-dir", d.StateDir, "directory recording original settings for restore")
	fs.IntVar(&f.v.MaxReadAheadKB, "max-read-ahead-kb", d.MaxReadAheadKB, fmt.Sprintf("largest read_ahead_kb readaheadd may set (%d..%d)", MinReadAheadKB, MaxReadAheadKBLimit))
	fs.BoolVar(&f.v.DryRun, "dry-run", false, "log and export the actions that would be taken, change nothing")
	fs.DurationVar(&f.interval, "interval", DefaultInterval, fmt.Sprintf("evaluation interval (%s..%s)", MinInterval, MaxInterval))
	fs.StringVar(&f.v.LogFormat, "log-format", d.LogFormat, "log format: text or json")
	fs.StringVar(&f.v.LogLevel, "log-level", d.LogLevel, "log level: debug, info, warn or error")
	fs.IntVar(&f.v.Nice, "nice", d.Nice, "CPU niceness of the daemon's threads (0..19; 0 leaves it as started; a higher one it was started with is kept)")
	return f
}

// AddDeviceFlags registers --device and --allow-os-disk into c: `run` and
// `restore` decide the same way which disks readaheadd may tune.
func AddDeviceFlags(fs *pflag.FlagSet, c *Config) {
	fs.StringArrayVar(&c.Devices, "device", nil, "block device to watch and tune, as named in /sys/block (repeatable; default: "+DefaultDevicesRule+")")
	fs.BoolVar(&c.AllowOSDisk, "allow-os-disk", false, "let readaheadd tune the disk that holds the root filesystem")
}

// Config returns the defaults, overlaid with the --config file if given,
// overlaid with the flags set on the command line. It does not validate.
func (f *Flags) Config() (Config, error) {
	c := Default()
	if f.configPath != "" {
		var err error
		if c, err = LoadFile(f.configPath, c); err != nil {
			return Config{}, err
		}
	}
	set := func(name string) bool { fl := f.fs.Lookup(name); return fl != nil && fl.Changed }
	if set("device") {
		c.Devices = f.v.Devices
	}
	if set("allow-path") {
		c.AllowPaths = f.v.AllowPaths
	}
	if set("allow-os-disk") {
		c.AllowOSDisk = f.v.AllowOSDisk
	}
	if set("allow-root-fs") {
		c.AllowRootFS = f.v.AllowRootFS
	}
	if set("metrics-addr") {
		c.MetricsAddr = f.v.MetricsAddr
	}
	if set("state-dir") {
		c.StateDir = f.v.StateDir
	}
	if set("max-read-ahead-kb") {
		c.MaxReadAheadKB = f.v.MaxReadAheadKB
	}
	if set("dry-run") {
		c.DryRun = f.v.DryRun
	}
	if set("interval") {
		c.Interval = Duration(f.interval)
	}
	if set("log-format") {
		c.LogFormat = f.v.LogFormat
	}
	if set("log-level") {
		c.LogLevel = f.v.LogLevel
	}
	if set("nice") {
		c.Nice = f.v.Nice
	}
	return c, nil
}

// Validated is a configuration that passed Validate, with its devices
// resolved to disks and its paths cleaned.
type Validated struct {
	Config
	Disks []blockdev.Disk
	// OSDisk is the disk that holds the root filesystem, "" if it could
	// not be identified (a root on tmpfs, overlay or btrfs).
	OSDisk   string
	Level    slog.Level
	Interval time.Duration
}

// Validate checks every value without changing anything on the machine.
// sys is the sysfs tree in which the devices must exist. The error, if any,
// is one line naming the problem.
func Validate(c Config, sys blockdev.SysFS) (Validated, error) {
	v := Validated{Config: c, Interval: time.Duration(c.Interval)}

	if c.MaxReadAheadKB < MinReadAheadKB || c.MaxReadAheadKB > MaxReadAheadKBLimit {
		return Validated{}, fmt.Errorf("max-read-ahead-kb %d is out of range: give %d..%d (KiB)", c.MaxReadAheadKB, MinReadAheadKB, MaxReadAheadKBLimit)
	}
	if c.Nice < 0 || c.Nice > MaxNice {
		return Validated{}, fmt.Errorf("nice %d is out of range: give 0..%d (0 leaves the niceness the daemon was started with)", c.Nice, MaxNice)
	}
	if v.Interval < MinInterval || v.Interval > MaxInterval {
		return Validated{}, fmt.Errorf("interval %s is out of range: give %s..%s", v.Interval, MinInterval, MaxInterval)
	}
	switch c.LogFormat {
	case LogText, LogJSON:
	default:
		return Validated{}, fmt.Errorf("log-format %q is not text or json", c.LogFormat)
	}
	if err := v.Level.UnmarshalText([]byte(c.LogLevel)); err != nil || c.LogLevel == "" {
		return Validated{}, fmt.Errorf("log-level %q is not debug, info, warn or error", c.LogLevel)
	}
	if err := validateAddr(c.MetricsAddr); err != nil {
		return Validated{}, err
	}
	if c.StateDir == "" || !filepath.IsAbs(c.StateDir) {
		return Validated{}, fmt.Errorf("state-dir %q is not an absolute path", c.StateDir)
	}
	v.StateDir = filepath.Clean(c.StateDir)
	if fi, err := os.Stat(v.StateDir); err == nil && !fi.IsDir() {
		return Validated{}, fmt.Errorf("state-dir %s exists and is not a directory", v.StateDir)
	}

	paths, err := ResolveAllowPaths(c)
	if err != nil {
		return Validated{}, err
	}
	v.AllowPaths = paths

	disks, osDisk, err := TunableDisks(c, sys)
	if err != nil {
		return Validated{}, err
	}
	v.Disks, v.OSDisk, v.Devices = disks, osDisk, nil
	for _, d := range disks {
		v.Devices = append(v.Devices, d.Name)
	}
	return v, nil
}

// ResolveAllowPaths checks c's allow-paths (existing directories; "/"
// only with AllowRootFS) and returns them with symlinks resolved.
func ResolveAllowPaths(c Config) ([]string, error) {
	var out []string
	for _, p := range c.AllowPaths {
		clean, err := validateAllowPath(p)
		if err != nil {
			return nil, err
		}
		if clean == "/" && !c.AllowRootFS {
			return nil, fmt.Errorf("allow-path %s is the whole root filesystem (every file of every service): give the data directories instead, or set allow-root-fs to mean it", p)
		}
		out = append(out, clean)
	}
	return out, nil
}

// rootFSDev returns the device number of the host's root filesystem:
// through /proc/1/root first, so that in a container with the host's PID
// namespace it is the host's and not the container's overlay.
var rootFSDev = func() (uint64, error) {
	var st unix.Stat_t
	err := unix.Stat("/proc/1/root", &st)
	if err != nil {
		err = unix.Stat("/", &st)
	}
	return st.Dev, err
}

// OSDisk returns the disk that holds the root filesystem, "" if it cannot
// be identified (a root filesystem on tmpfs, overlay or btrfs has no single
// block device number).
func OSDisk(sys blockdev.SysFS) string {
	dev, err := rootFSDev()
	if err != nil {
		return ""
	}
	d, err := sys.DiskOf(probe.DevFromUnix(dev))
	if err != nil {
		return ""
	}
	return d.Name
}

// TunableDisks resolves which disks readaheadd may tune under c: the
// devices given, or DefaultDevicesRule; the OS disk only with
// AllowOSDisk. The daemon and `readaheadd restore` both use it, so that
// restore writes only to disks the daemon may tune.
func TunableDisks(c Config, sys blockdev.SysFS) (disks []blockdev.Disk, osDisk string, err error) {
	osDisk = OSDisk(sys)
	if len(c.Devices) == 0 {
		all, err := sys.DefaultDisks()
		if err != nil {
			return nil, osDisk, fmt.Errorf("find default devices: %v (give --device)", err)
		}
		for _, d := range all {
			if d.Name == osDisk && !c.AllowOSDisk {
				continue
			}
			disks = append(disks, d)
		}
		if len(disks) == 0 {
			return nil, osDisk, fmt.Errorf("no disk found to watch (the default is %s): give --device", DefaultDevicesRule)
		}
		return disks, osDisk, nil
	}
	seen := map[string]bool{}
	for _, name := range c.Devices {
		if err := blockdev.ValidName(name); err != nil {
			return nil, osDisk, fmt.Errorf("device: %v", err)
		}
		if seen[name] {
			continue
		}
		seen[name] = true
		d, err := sys.Lookup(name)
		if err != nil {
			return nil, osDisk, fmt.Errorf("device: %v", err)
		}
		if name == osDisk && !c.AllowOSDisk {
			return nil, osDisk, fmt.Errorf("device %s holds the root filesystem (the OS disk, shared by every service): set allow-os-disk (--allow-os-disk) to tune it anyway", name)
		}
		disks = append(disks, d)
	}
	return disks, osDisk, nil
}

func validateAddr(addr string) error {
	if addr == "" {
		return nil // disabled
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("metrics-addr %q is not HOST:PORT (for example 127.0.0.1:9477; \"\" disables)", addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("metrics-addr %q: port %q is not a number in 0..65535", addr, port)
	}
	if host != "" && net.ParseIP(host) == nil && !validHostname(host) {
		return fmt.Errorf("metrics-addr %q: host %q is neither an IP address nor a host name", addr, host)
	}
	return nil
}

func validHostname(h string) bool {
	if len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, r := range label {
			if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	return true
}

// validateAllowPath returns the path with symlinks resolved: the tuner
// compares it with the kernel's view of open files (/proc/PID/fd links),
// which never contain symlinks, so a symlinked prefix would match nothing,
// and a prefix that is a symlink to elsewhere must not widen the scope
// silently.
func validateAllowPath(p string) (string, error) {
	if p == "" || !filepath.IsAbs(p) {
		return "", fmt.Errorf("allow-path %q is not an absolute path", p)
	}
	real, err := filepath.EvalSymlinks(filepath.Clean(p))
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("allow-path %s does not exist", p)
		}
		return "", fmt.Errorf("allow-path %s: %v", p, err)
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", fmt.Errorf("allow-path %s: %v", p, err)
	}
	// Per-file actions are scoped by directory; a file here would pass
	// this check and fail only later, after the probe attached.
	if !fi.IsDir() {
		return "", fmt.Errorf("allow-path %s is not a directory: give the directory that holds the files (such as the DataNode's data directory)", p)
	}
	return real, nil
}
