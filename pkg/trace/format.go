package trace

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// WriteJSON writes rep as one JSON object on one line.
func WriteJSON(w io.Writer, rep Report) error {
	b, err := json.Marshal(rep)
	if err != nil {
		return fmt.Errorf("encode trace report: %w", err)
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

func human(b float64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1fG", b/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1fM", b/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.0fK", b/(1<<10))
	default:
		return fmt.Sprintf("%.0f", b)
	}
}

func lat(d time.Duration) string {
	switch {
	case d >= time.Second:
		return fmt.Sprintf("%.2fs", d.Seconds())
	case d >= time.Millisecond:
		return fmt.Sprintf("%.2fms", float64(d)/float64(time.Millisecond))
	default:
		return fmt.Sprintf("%.0fus", float64(d)/float64(time.Microsecond))
	}
}

// WriteText writes rep as a biotop-like table: per-disk totals, then the
// top files.
func WriteText(w io.Writer, rep Report) error {
	var b strings.Builder
	secs := rep.End.Sub(rep.Start).Seconds()
	if secs <= 0 {
		secs = 1
	}
	fmt.Fprintf(&b, "%s  interval %.1fs", rep.End.Format("15:04:05"), secs)
	if rep.Lost > 0 {
		fmt.Fprintf(&b, "  LOST %d events since start", rep.Lost)
	}
	b.WriteString("\n")
	fmt.Fprintf(&b, "%-10s %10s %8s %8s %9s %9s %6s %8s\n", "DISK", "READ/s", "REQ/s", "AVG_SZ", "MEAN_LAT", "P99_LAT", "DEPTH", "NONFILE")
	for _, d := range rep.Devices {
		avg := 0.0
		if d.Requests > 0 {
			avg = float64(d.Bytes) / float64(d.Requests)
		}
		fmt.Fprintf(&b, "%-10s %10s %8.0f %8s %9s %9s %6.1f %8d\n", d.Name, human(float64(d.Bytes)/secs),
			float64(d.Requests)/secs, human(avg), lat(d.MeanLat), lat(d.P99Lat), d.MeanDepth, d.Other)
	}
	if len(rep.Files) > 0 {
		fmt.Fprintf(&b, "%-10s %10s %8s %8s %9s %9s %6s %-22s %s\n", "DISK", "READ/s", "REQ/s", "AVG_SZ", "MEAN_LAT", "P99_LAT", "DEPTH", "READER", "FILE")
	}
	for _, f := range rep.Files {
		reader := "-"
		if len(f.Readers) > 0 {
			reader = fmt.Sprintf("%d/%s", f.Readers[0].Tgid, f.Readers[0].Comm)
			if len(f.Readers) > 1 {
				reader += fmt.Sprintf("+%d", len(f.Readers)-1)
			}
		}
		name := f.Path
		if name == "" {
			name = f.FileID
		}
		fmt.Fprintf(&b, "%-10s %10s %8.0f %8s %9s %9s %6.1f %-22s %s\n", f.DiskName, human(float64(f.Bytes)/secs),
			float64(f.Requests)/secs, human(f.MeanSize), lat(f.MeanLat), lat(f.P99Lat), f.MeanDepth, reader, name)
	}
	b.WriteString("\n")
	_, err := io.WriteString(w, b.String())
	return err
}
