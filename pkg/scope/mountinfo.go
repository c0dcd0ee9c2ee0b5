package scope

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/readaheadd/readaheadd/pkg/probe"
)

// Mount is one line of /proc/PID/mountinfo.
type Mount struct {
	ID   int
	Dev  probe.Dev
	Root string // the directory of the file system this mount shows
	// Point is where it is mounted, relative to the process's root.
	Point string
}

// readMountinfo parses a mountinfo file.
func readMountinfo(path string) ([]Mount, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return parseMountinfo(f)
}

func parseMountinfo(r io.Reader) ([]Mount, error) {
	var out []Mount
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		// 36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		id, err := strconv.Atoi(f[0])
		if err != nil {
			return nil, fmt.Errorf("mountinfo line %q: bad mount id", sc.Text())
		}
		maj, min, ok := strings.Cut(f[2], ":")
		if !ok {
			return nil, fmt.Errorf("mountinfo line %q: bad device", sc.Text())
		}
		ma, err1 := strconv.ParseUint(maj, 10, 32)
		mi, err2 := strconv.ParseUint(min, 10, 32)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("mountinfo line %q: bad device", sc.Text())
		}
		out = append(out, Mount{ID: id, Dev: probe.MkDev(uint32(ma), uint32(mi)), Root: unescape(f[3]), Point: unescape(f[4])})
	}
	return out, sc.Err()
}

// unescape undoes the kernel's octal escapes (\040 for a space, \011,
// \012, \134) in mountinfo paths.
func unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// mountID reads the mount a process's descriptor lies on (the mnt_id line
// of /proc/PID/fdinfo/FD).
func mountID(proc string, tgid uint32, fd int) (int, error) {
	b, err := os.ReadFile(filepath.Join(proc, strconv.FormatUint(uint64(tgid), 10), "fdinfo", strconv.Itoa(fd)))
	if err != nil {
		return 0, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(l, "mnt_id:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("no mnt_id in fdinfo of %d/%d", tgid, fd)
}

// under reports whether p is dir or below it (both clean, absolute).
func under(p, dir string) bool {
	return p == dir || dir == "/" || strings.HasPrefix(p, dir+"/")
}

// rel returns p relative to dir ("" for dir itself); p must be under dir.
func rel(p, dir string) string {
	if p == dir {
		return ""
	}
	if dir == "/" {
		return strings.TrimPrefix(p, "/")
	}
	return strings.TrimPrefix(p, dir+"/")
}
