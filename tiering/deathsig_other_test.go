//go:build !linux

package tiering

import "os/exec"

// dieWithParent is a no-op where there is no parent-death signal: the
// test's cleanup still stops the process.
func dieWithParent(*exec.Cmd) {}
