package lktest

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the server die with the test binary, even one killed by a timeout.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
