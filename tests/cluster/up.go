package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

const (
	serviceCIDR = "10.96.0.0/16"
	serviceIP   = "10.96.0.1"
	// enabledControllers are the kube-controller-manager loops the tests rely on. Those that
	// need a cloud, volumes, or a kubelet API (attach/detach, node IPAM, CSR signing) stay off.
	enabledControllers = "deployment-controller,replicaset-controller,daemonset-controller," +
		"statefulset-controller,job-controller,endpointslice-controller,endpoints-controller," +
		"garbage-collector-controller,namespace-controller,serviceaccount-controller," +
		"serviceaccount-token-controller,node-lifecycle-controller,taint-eviction-controller," +
		"pod-garbage-collector-controller,root-ca-certificate-publisher-controller," +
		"clusterrole-aggregation-controller,disruption-controller,ttl-after-finished-controller"
)

// upOptions are the few knobs tests need; everything else is fixed so every run is alike.
type upOptions struct {
	dir                    string
	address                string
	nodeMonitorGracePeriod time.Duration
	verbosity              int
}

// runUp starts etcd in this process and the three components as child processes, writes an
// admin kubeconfig and cluster.json into dir, prints "ready" once the API server answers
// /readyz, then supervises until SIGTERM/SIGINT or until any component dies.
func runUp(args []string) int {
	var opts upOptions
	flags := flag.NewFlagSet("up", flag.ContinueOnError)
	flags.StringVar(&opts.dir, "dir", "", "state directory (certificates, etcd data, logs, kubeconfig)")
	flags.StringVar(&opts.address, "address", "127.0.0.1",
		"the API server's address: 127.0.0.1, or the host's address on the nodes' bridge when nodes have networks of their own")
	flags.DurationVar(&opts.nodeMonitorGracePeriod, "node-monitor-grace-period", 6*time.Second,
		"how long a node may miss heartbeats before it turns NotReady")
	flags.IntVar(&opts.verbosity, "v", 1, "klog verbosity of the components")
	if err := flags.Parse(args); err != nil || opts.dir == "" || net.ParseIP(opts.address) == nil {
		fmt.Fprintln(os.Stderr, "usage: kcluster up --dir DIR [--address IP] [--node-monitor-grace-period 6s] [--v N]")
		return 2
	}
	if err := up(opts); err != nil {
		fmt.Fprintf(os.Stderr, "kcluster up: %v\n", err)
		return 1
	}
	return 0
}

func up(opts upOptions) error {
	started := time.Now()
	dir, err := filepath.Abs(opts.dir)
	if err != nil {
		return err
	}
	for _, sub := range []string{"pki", "logs"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return err
		}
	}
	certs, err := newPKI(filepath.Join(dir, "pki"), net.ParseIP(opts.address))
	if err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	ports, err := freePorts(5)
	if err != nil {
		return err
	}
	apiPort, etcdClientPort, etcdPeerPort, cmPort, schedulerPort := ports[0], ports[1], ports[2], ports[3], ports[4]

	etcd, err := startEtcd(filepath.Join(dir, "etcd"), etcdClientPort, etcdPeerPort)
	if err != nil {
		return fmt.Errorf("etcd: %w", err)
	}
	defer etcd.Close()

	server := fmt.Sprintf("https://%s:%d", opts.address, apiPort)
	kubeconfig := filepath.Join(dir, "admin.kubeconfig")
	if err := writeKubeconfig(kubeconfig, server, certs); err != nil {
		return err
	}

	auditPolicy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(auditPolicy, []byte(auditPolicyYAML), 0o600); err != nil {
		return err
	}

	self, err := os.Executable()
	if err != nil {
		return err
	}
	verbosity := fmt.Sprintf("--v=%d", opts.verbosity)
	specs := []componentSpec{
		{name: "kube-apiserver", args: []string{
			fmt.Sprintf("--etcd-servers=http://127.0.0.1:%d", etcdClientPort),
			fmt.Sprintf("--secure-port=%d", apiPort),
			"--bind-address=" + opts.address,
			"--advertise-address=" + opts.address,
			// Endpoints may not hold loopback addresses, so the "kubernetes" Service gets
			// none; pods find the API server through KUBERNETES_SERVICE_HOST (the address).
			"--endpoint-reconciler-type=none",
			"--tls-cert-file=" + certs.ServingCert,
			"--tls-private-key-file=" + certs.ServingKey,
			"--client-ca-file=" + certs.CACert,
			"--authorization-mode=RBAC",
			"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
			"--service-account-key-file=" + certs.ServiceAccountPub,
			"--service-account-signing-key-file=" + certs.ServiceAccountKey,
			"--service-cluster-ip-range=" + serviceCIDR,
			"--allow-privileged=true",
			// Nodes' Hostname addresses do not resolve; their InternalIPs are local addresses
			// where the process kubelet serves container logs.
			"--kubelet-preferred-address-types=InternalIP",
			"--kubelet-client-certificate=" + certs.AdminCert,
			"--kubelet-client-key=" + certs.AdminKey,
			"--enable-priority-and-fairness=false",
			"--profiling=false",
			"--audit-policy-file=" + auditPolicy,
			"--audit-log-path=" + filepath.Join(dir, "logs", "audit.log"),
			"--audit-log-format=json",
			"--cert-dir=" + filepath.Join(dir, "pki"),
			verbosity,
		}},
		{name: "kube-controller-manager", args: []string{
			"--kubeconfig=" + kubeconfig,
			"--leader-elect=false",
			"--controllers=" + enabledControllers,
			"--service-account-private-key-file=" + certs.ServiceAccountKey,
			"--root-ca-file=" + certs.CACert,
			"--use-service-account-credentials=true",
			"--node-monitor-period=1s",
			"--node-monitor-grace-period=" + opts.nodeMonitorGracePeriod.String(),
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", cmPort),
			"--profiling=false",
			verbosity,
		}},
		{name: "kube-scheduler", args: []string{
			"--kubeconfig=" + kubeconfig,
			"--leader-elect=false",
			"--bind-address=127.0.0.1",
			fmt.Sprintf("--secure-port=%d", schedulerPort),
			"--profiling=false",
			verbosity,
		}},
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	exited := make(chan componentExit, len(specs))
	var running []*component
	defer func() { stopComponents(running) }()
	for _, spec := range specs {
		c, err := startComponent(self, filepath.Join(dir, "logs"), spec, exited)
		if err != nil {
			return err
		}
		running = append(running, c)
	}

	if err := waitReady(ctx, server, certs, exited); err != nil {
		return err
	}
	info := map[string]any{
		"server": server, "kubeconfig": kubeconfig, "ca": certs.CACert,
		"kubeletCert": certs.KubeletCert, "kubeletKey": certs.KubeletKey,
		"serviceAccountIssuer": "https://kubernetes.default.svc.cluster.local",
		"pid":                  os.Getpid(), "startSeconds": time.Since(started).Seconds(),
		"logs": filepath.Join(dir, "logs"), "etcd": fmt.Sprintf("http://127.0.0.1:%d", etcdClientPort),
	}
	if err := writeJSONAtomically(filepath.Join(dir, "cluster.json"), info); err != nil {
		return err
	}
	fmt.Printf("ready %s %.2fs\n", server, time.Since(started).Seconds())

	select {
	case <-ctx.Done():
		return nil
	case e := <-exited:
		return fmt.Errorf("%s exited unexpectedly (%v); see %s", e.name, e.err, filepath.Join(dir, "logs", e.name+".log"))
	case err := <-etcd.Err():
		return fmt.Errorf("etcd failed: %w", err)
	}
}

// waitReady polls /readyz as the admin: it turns OK only after the API server has finished
// its post-start hooks (RBAC bootstrap roles, the default namespace, system priority classes).
// auditPolicyYAML records every write (who, what, when; no bodies) once, when its response is
// sent: tests read logs/audit.log to prove who changed what and in which order. Reads, the
// kubelet's Lease heartbeats and Events are left out: they would drown the writes.
const auditPolicyYAML = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
- level: None
  resources: [{group: coordination.k8s.io, resources: [leases]}, {group: "", resources: [events]}, {group: events.k8s.io, resources: [events]}]
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
`

func waitReady(ctx context.Context, server string, certs *pki, exited <-chan componentExit) error {
	client, err := adminHTTPClient(certs)
	if err != nil {
		return err
	}
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case e := <-exited:
			return fmt.Errorf("%s exited during start-up: %v", e.name, e.err)
		default:
		}
		resp, err := client.Get(server + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	return fmt.Errorf("kube-apiserver not ready at %s after 90s", server)
}

func adminHTTPClient(certs *pki) (*http.Client, error) {
	caPEM, err := os.ReadFile(certs.CACert)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(caPEM)
	pair, err := tls.LoadX509KeyPair(certs.AdminCert, certs.AdminKey)
	if err != nil {
		return nil, err
	}
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}},
	}}, nil
}

// freePorts asks the kernel for n distinct unused ports. Holding all listeners until every
// port is chosen keeps the kernel from handing out the same port twice.
func freePorts(n int) ([]int, error) {
	var listeners []net.Listener
	defer func() {
		for _, l := range listeners {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for i := 0; i < n; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		listeners = append(listeners, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func writeKubeconfig(path, server string, certs *pki) error {
	abs := func(p string) string { return strings.ReplaceAll(p, `"`, `\"`) }
	content := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: weightcache-test
  cluster:
    server: %s
    certificate-authority: "%s"
users:
- name: admin
  user:
    client-certificate: "%s"
    client-key: "%s"
contexts:
- name: weightcache-test
  context:
    cluster: weightcache-test
    user: admin
    namespace: default
current-context: weightcache-test
`, server, abs(certs.CACert), abs(certs.AdminCert), abs(certs.AdminKey))
	return os.WriteFile(path, []byte(content), 0o600)
}

func writeJSONAtomically(path string, value any) error {
	data, err := json.MarshalIndent(value, "", "  ")
	if err != nil {
		return err
	}
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}
