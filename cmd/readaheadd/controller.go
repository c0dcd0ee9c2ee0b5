package main

import (
	"log/slog"
	"sync"
	"time"

	"github.com/readaheadd/readaheadd/pkg/blockdev"
	"github.com/readaheadd/readaheadd/pkg/detector"
	"github.com/readaheadd/readaheadd/pkg/metrics"
	"github.com/readaheadd/readaheadd/pkg/probe"
	"github.com/readaheadd/readaheadd/pkg/state"
)

// observer is the controller used until regime detection and tuning are
// connected: it watches, exports each device's window next to the value it
// had at start, and changes nothing, so it has nothing to restore.
type observer struct {
	sys   blockdev.SysFS
	store *state.Store
	log   *slog.Logger
	disks []blockdev.Disk

	mu       sync.Mutex
	original map[string]int // read_ahead_kb at start
	records  uint64
	ra       uint64
}

func newController(d controlDeps) controller {
	o := &observer{sys: d.sys, store: d.store, log: d.log, disks: d.cfg.Disks, original: map[string]int{}}
	for _, disk := range d.cfg.Disks {
		kb, err := d.sys.ReadAheadKB(disk.Name)
		if err != nil {
			d.log.Warn("read read_ahead_kb", "device", disk.Name, "error", err)
			continue
		}
		o.original[disk.Name] = kb
	}
	d.log.Info("observing only: regime detection and tuning are not connected in this build; no setting will be changed")
	return o
}

func (o *observer) HandleRecord(probe.Record) {
	o.mu.Lock()
	o.records++
	o.mu.Unlock()
}

func (o *observer) HandleReadahead(probe.ReadaheadEvent) {
	o.mu.Lock()
	o.ra++
	o.mu.Unlock()
}

func (o *observer) Step(time.Duration) {}

func (o *observer) Snapshot() (detector.Snapshot, bool) { return detector.Snapshot{}, false }

func (o *observer) TunerStatus() metrics.TunerStatus {
	ts := metrics.TunerStatus{DryRun: true}
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, d := range o.disks {
		cur, err := o.sys.ReadAheadKB(d.Name)
		if err != nil {
			continue // gone; nothing to export
		}
		orig, ok := o.store.Original(d.Name)
		if !ok {
			orig = o.original[d.Name]
		}
		ts.Devices = append(ts.Devices, metrics.DeviceState{Name: d.Name, Dev: d.Dev.String(), ReadAheadKB: cur, OriginalKB: orig})
	}
	return ts
}

func (o *observer) RestoreAll() error { return nil }
