package logbench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

// TestRunSmall runs every measurement briefly so the tool cannot rot.
func TestRunSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("writes ~300 MiB")
	}
	var out bytes.Buffer
	err := Run(Options{Dir: t.TempDir(), Duration: 100 * time.Millisecond, Bytes: 8 << 20, OpenGiB: 0.05, Out: &out})
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"plain write+fdatasync 16KiB", "engine 16KiB x 64 appenders", "allocations: append", "open 0.1 GiB"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}
