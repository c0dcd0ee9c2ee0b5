package probe

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"golang.org/x/sys/unix"
)

func TestDevEncoding(t *testing.T) {
	d := MkDev(259, 70000)
	assert.Equal(t, uint32(259), d.Major())
	assert.Equal(t, uint32(70000), d.Minor())
	assert.Equal(t, "259:70000", d.String())
	// st_dev as glibc encodes it, for majors and minors past 8 bits.
	assert.Equal(t, d, DevFromUnix(unix.Mkdev(259, 70000)))
	assert.Equal(t, MkDev(7, 3), DevFromUnix(unix.Mkdev(7, 3)))
}

func TestFileKey(t *testing.T) {
	k := FileKey{Dev: MkDev(7, 0), Ino: 12}
	assert.Equal(t, "7:0/12", k.String())
	assert.False(t, k.IsZero())
	assert.True(t, FileKey{}.IsZero())
}
