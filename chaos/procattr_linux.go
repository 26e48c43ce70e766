package chaos

import "syscall"

// procAttr makes a node process die with the test process (SIGKILL on the
// parent's death), so a test that times out leaves no server running.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
