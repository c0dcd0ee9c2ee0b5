package detector

import "time"

// The daemon's cadence: Evaluate every interval (--interval, one Window),
// FastPath every FastPathInterval(interval) in between. Tests and replays
// that score the detector drive it the same way, so that what they measure
// is what the daemon does.
const (
	// DefaultInterval is the daemon's default evaluation interval and the
	// default Window.
	DefaultInterval = time.Second
	// MaxFastPathInterval bounds the time between FastPath calls: a
	// DataNode reads a 256 MB block in 2-4 s, so a strongly slowed block
	// file must be seen within a few hundred milliseconds.
	MaxFastPathInterval = 100 * time.Millisecond
)

// FastPathInterval returns how often to call FastPath when Evaluate runs
// every interval: the smaller of MaxFastPathInterval and a quarter of the
// interval.
func FastPathInterval(interval time.Duration) time.Duration {
	return max(min(interval/4, MaxFastPathInterval), time.Millisecond)
}
