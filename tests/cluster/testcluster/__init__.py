"""A real Kubernetes control plane plus a process kubelet, for weightcache's end-to-end tests.

The control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) is built
from the upstream Go modules by ``tests/cluster/build.sh``; the kubelet is Python and runs
each pod's containers as local processes. Nothing here mocks the API server.
"""
