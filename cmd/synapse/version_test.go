package main

import (
	"context"
	"runtime"
	"strings"
	"testing"
)

func TestVersion(t *testing.T) {
	out, _, err := run(t, context.Background(), "version")
	if err != nil {
		t.Fatal(err)
	}
	bi := currentBuildInfo()
	for _, want := range []string{
		"version:  " + bi.Version + "\n",
		"commit:   " + bi.Commit + "\n",
		"go:       " + runtime.Version() + "\n",
		"platform: " + runtime.GOOS + "/" + runtime.GOARCH + "\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("version output lacks %q:\n%s", want, out)
		}
	}
	if bi.Version == "" || bi.Commit == "" {
		t.Errorf("empty version or commit: %+v", bi)
	}
}
