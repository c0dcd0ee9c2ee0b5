package prior

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// A stream that kept the window of an older prior (its open came before
// the prior climbed) confirms the prior; it does not lower it.
func TestStreamFromAnOlderPriorDoesNotLowerIt(t *testing.T) {
	m := New()
	k1 := probe.FileKey{Dev: 1, Ino: 1}
	k2 := probe.FileKey{Dev: 1, Ino: 2}
	m.Learn(k1, "sdb", "/d/a", 2048, 128, 50e6, 380e6, time.Second, time.Now())
	m.Learn(k2, "sdb", "/d/b", 1024, 128, 50e6, 250e6, 2*time.Second, time.Now())
	kb, p := m.Lookup(probe.FileKey{Dev: 1, Ino: 3}, "/d/c")
	assert.Equal(t, 2048, kb)
	assert.Equal(t, 380e6, p.KeptBPS)
	assert.Equal(t, 2, p.Streams)
	kb, _ = m.Lookup(k2, "/d/b")
	assert.Equal(t, 2048, kb, "a file's own window, or its directory's if that climbed above it")
}

// One climber at a time: a climb ended by its verdict frees the prior for
// the next open; one that did not pay holds the knee until first.
func TestPriorHasOneClimberAtATime(t *testing.T) {
	m := New()
	k1, k2 := probe.FileKey{Dev: 1, Ino: 1}, probe.FileKey{Dev: 1, Ino: 2}
	m.Learn(k1, "sdb", "/d/a", 512, 128, 50e6, 150e6, 0, time.Now())
	_, p := m.Lookup(k2, "/d/b")
	assert.Equal(t, 1024, m.Climb(p, k2, time.Second, 2, 4096, time.Minute))
	assert.Zero(t, m.Climb(p, k1, 2*time.Second, 2, 4096, time.Minute), "k2 climbs")
	m.Climbed(p, k2, false, 10*time.Second, time.Hour)
	assert.Zero(t, m.Climb(p, k1, 3*time.Second, 2, 4096, time.Minute), "the knee holds")
	assert.Equal(t, 1024, m.Climb(p, k1, 10*time.Second, 2, 4096, time.Minute))
}

// A device's saturation point and its fitted capacity are kept side by
// side: forgetting one keeps the other, forgetting both drops the device,
// and both go through the priors file's export and load.
func TestCapacityAndFitKeptSideBySide(t *testing.T) {
	m := New()
	wall := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	m.SetFitted("sdb", 150e6, wall)
	m.SetCapacity("sdb", 40e6, wall)
	assert.Equal(t, 150e6, m.Fitted("sdb"))
	assert.Equal(t, 40e6, m.Capacity("sdb"))

	n := New()
	assert.Zero(t, n.Load(m.export(), func(string) bool { return true }, nil, 4096, 0))
	assert.Equal(t, 150e6, n.Fitted("sdb"))
	assert.Equal(t, 40e6, n.Capacity("sdb"))

	m.SetCapacity("sdb", 0, wall)
	assert.Equal(t, 150e6, m.Fitted("sdb"), "the fit outlives the saturation point")
	_, _, caps := m.Len()
	assert.Equal(t, 1, caps)
	m.SetFitted("sdb", 0, wall)
	_, _, caps = m.Len()
	assert.Zero(t, caps)
}
