package tiering

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes cmd's process die with the test binary, even if that
// is killed.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
