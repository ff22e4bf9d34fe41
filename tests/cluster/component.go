package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"time"
)

// componentSpec names one Kubernetes component and the flags it runs with.
type componentSpec struct {
	name string
	args []string
}

type componentExit struct {
	name string
	err  error
}

type component struct {
	name string
	cmd  *exec.Cmd
	done chan struct{}
}

// startComponent re-executes this binary as one component. Pdeathsig ties the child's life to
// ours, so a test run that kills `kcluster up` with SIGKILL still leaves no stray component.
func startComponent(self, logDir string, spec componentSpec, exited chan<- componentExit) (*component, error) {
	logFile, err := os.Create(filepath.Join(logDir, spec.name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(self, append([]string{spec.name}, spec.args...)...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, err
	}
	c := &component{name: spec.name, cmd: cmd, done: make(chan struct{})}
	go func() {
		err := cmd.Wait()
		logFile.Close()
		close(c.done)
		exited <- componentExit{name: spec.name, err: err}
	}()
	return c, nil
}

// stopComponents asks every component to stop, gives them a few seconds to flush, then kills
// whatever is left; components are stopped before etcd so none of them logs a storm of errors.
func stopComponents(components []*component) {
	for _, c := range components {
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
	}
	deadline := time.After(5 * time.Second)
	for _, c := range components {
		select {
		case <-c.done:
		case <-deadline:
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
}
