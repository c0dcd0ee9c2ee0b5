package actuate

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// NORMAL copies the device's window, SEQUENTIAL twice it; any other value
// only through the device.
func TestAdviceFor(t *testing.T) {
	for _, c := range []struct {
		kb, deviceKB int
		advice       Advice
		through      bool
	}{
		{128, 128, AdviceNormal, false},
		{256, 128, AdviceSequential, false},
		{0, 0, AdviceNormal, false},
		{0, 128, AdviceNormal, true},
		{512, 128, AdviceNormal, true},
		{64, 128, AdviceNormal, true},
	} {
		a, through := AdviceFor(c.kb, c.deviceKB)
		assert.Equal(t, c.advice, a, "%d KB on a device at %d KB", c.kb, c.deviceKB)
		assert.Equal(t, c.through, through, "%d KB on a device at %d KB", c.kb, c.deviceKB)
	}
}

func TestLowerStatsConfirmed(t *testing.T) {
	a, b := FileRef{Tgid: 1, FD: 3}, FileRef{Tgid: 1, FD: 4}
	st := LowerStats{Left: []Unconfirmed{{Ref: b, Why: "window still above"}}}
	assert.True(t, st.Confirmed(a))
	assert.False(t, st.Confirmed(b))
}
