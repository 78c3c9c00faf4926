// The pod sandbox's first process for the tests' kubelet (what a "pause" image runs).
//
// No registry is reachable on the test machines, so the sandbox image is built here from
// this file: a static binary that holds the pod's namespaces open, reaps the orphans the
// pod's containers leave behind (it is PID 1 of the pod when the PID namespace is
// shared), and exits 0 on SIGINT or SIGTERM, so that stopping a sandbox takes no grace
// period. It needs nothing but the Go standard library.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "-v" {
		os.Stdout.WriteString("gym-telemetry test pause 1\n")
		return
	}
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			// Reap every exited child; stop at the first "none left" (0) or error.
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
