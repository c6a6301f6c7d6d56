package tiering

import (
	"bufio"
	"bytes"
	"os"
	"strconv"
	"strings"
	"time"
)

// pressure reads the kernel's CPU pressure stall information (PSI, Linux
// 4.20+): the time during which some runnable task waited for a processor,
// for the broker's cgroup (cgroup v2) or else the whole machine. That wait
// is what a tail request meets when catch-up work fills the machine, in the
// broker and in whatever shares its processors.
type pressure struct {
	path  string
	total time.Duration // "some" total at the last read
	at    time.Time
}

// openPressure returns a reader of the first PSI file that works, or nil.
func openPressure() *pressure {
	var paths []string
	if b, err := os.ReadFile("/proc/self/cgroup"); err == nil {
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			if dir, ok := strings.CutPrefix(sc.Text(), "0::"); ok {
				paths = append(paths, "/sys/fs/cgroup"+dir+"/cpu.pressure")
			}
		}
	}
	paths = append(paths, "/proc/pressure/cpu")
	for _, path := range paths {
		if total, ok := readPressure(path); ok {
			return &pressure{path: path, total: total, at: time.Now()}
		}
	}
	return nil
}

// share returns the fraction of the time since the last call during which
// some task waited for a processor; false if the file cannot be read or the
// last call was more than maxAge ago (a share over an idle spell says
// nothing about now; the next call measures from this one).
func (p *pressure) share(now time.Time, maxAge time.Duration) (float64, bool) {
	total, ok := readPressure(p.path)
	if !ok {
		return 0, false
	}
	el := now.Sub(p.at)
	d := total - p.total
	p.total, p.at = total, now
	if el <= 0 || el > maxAge || d < 0 {
		return 0, false
	}
	return min(float64(d)/float64(el), 1), true
}

// readPressure parses the "some ... total=<µs>" line of a PSI file.
func readPressure(path string) (time.Duration, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	return parsePressure(b)
}

func parsePressure(b []byte) (time.Duration, bool) {
	for line := range strings.SplitSeq(string(b), "\n") {
		rest, ok := strings.CutPrefix(line, "some ")
		if !ok {
			continue
		}
		for f := range strings.FieldsSeq(rest) {
			if v, ok := strings.CutPrefix(f, "total="); ok {
				us, err := strconv.ParseInt(v, 10, 64)
				if err != nil || us < 0 {
					return 0, false
				}
				return time.Duration(us) * time.Microsecond, true
			}
		}
	}
	return 0, false
}
