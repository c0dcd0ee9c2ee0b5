package lab

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// DiskStats are the read counters of /proc/diskstats for one device: what
// the block layer saw, independent of labfs's own accounting.
type DiskStats struct {
	Reads       uint64        // completed read requests
	Merged      uint64        // reads merged
	Sectors     uint64        // 512-byte sectors read
	ReadTime    time.Duration // summed latency of the completed reads
	InFlight    uint64
	IOTime      time.Duration // time with at least one request in flight
	WeightedIOs time.Duration
}

// Sub returns s - o.
func (s DiskStats) Sub(o DiskStats) DiskStats {
	return DiskStats{Reads: s.Reads - o.Reads, Merged: s.Merged - o.Merged, Sectors: s.Sectors - o.Sectors,
		ReadTime: s.ReadTime - o.ReadTime, InFlight: s.InFlight, IOTime: s.IOTime - o.IOTime,
		WeightedIOs: s.WeightedIOs - o.WeightedIOs}
}

// MeanReadLatency is the mean block-layer latency of the reads counted.
func (s DiskStats) MeanReadLatency() time.Duration {
	if s.Reads == 0 {
		return 0
	}
	return s.ReadTime / time.Duration(s.Reads)
}

// MeanReadKB is the mean read request size.
func (s DiskStats) MeanReadKB() float64 {
	if s.Reads == 0 {
		return 0
	}
	return float64(s.Sectors) * 512 / 1024 / float64(s.Reads)
}

// DiskStats reads the lab device's line of /proc/diskstats.
func (l *Lab) DiskStats() (DiskStats, error) { return ReadDiskStats(l.Name) }

// ReadDiskStats reads device name's line of /proc/diskstats.
func ReadDiskStats(name string) (DiskStats, error) {
	f, err := os.Open("/proc/diskstats")
	if err != nil {
		return DiskStats{}, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 14 || fs[2] != name {
			continue
		}
		v := make([]uint64, 11)
		for i := range v {
			if v[i], err = strconv.ParseUint(fs[3+i], 10, 64); err != nil {
				return DiskStats{}, fmt.Errorf("/proc/diskstats %s: %w", name, err)
			}
		}
		ms := time.Millisecond
		return DiskStats{Reads: v[0], Merged: v[1], Sectors: v[2], ReadTime: time.Duration(v[3]) * ms,
			InFlight: v[8], IOTime: time.Duration(v[9]) * ms, WeightedIOs: time.Duration(v[10]) * ms}, nil
	}
	return DiskStats{}, fmt.Errorf("%s is not in /proc/diskstats", name)
}
