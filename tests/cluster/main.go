// Command kcluster is one multi-call binary holding a whole Kubernetes control plane
// for weightcache's end-to-end tests: embedded etcd, kube-apiserver,
// kube-controller-manager and kube-scheduler, all built from the upstream modules.
//
// The three Kubernetes components keep process-global state (flag sets, feature
// gates, the legacy metrics registry, klog), so each runs in a process of its own:
// `kcluster up` runs etcd itself and re-executes this binary once per component.
package main

import (
	"fmt"
	"os"
	_ "time/tzdata" // CronJob time zones, as in the upstream kube-controller-manager main

	"github.com/spf13/cobra"
	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"
	_ "k8s.io/component-base/metrics/prometheus/clientgo"
	_ "k8s.io/component-base/metrics/prometheus/version"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

// components maps a sub-command to the upstream command it runs unchanged.
var components = map[string]func() *cobra.Command{
	"kube-apiserver":          apiserver.NewAPIServerCommand,
	"kube-controller-manager": controllermanager.NewControllerManagerCommand,
	"kube-scheduler":          func() *cobra.Command { return scheduler.NewSchedulerCommand() },
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: kcluster up --dir DIR | kube-apiserver|kube-controller-manager|kube-scheduler [flags]")
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	if name == "up" {
		os.Exit(runUp(args))
	}
	newCommand, ok := components[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "kcluster: unknown sub-command %q\n", name)
		os.Exit(2)
	}
	command := newCommand()
	command.SetArgs(args)
	os.Exit(cli.Run(command))
}
