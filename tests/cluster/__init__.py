"""The local Kubernetes control plane for tests and the demo (real upstream binaries, no Docker).

`python -m tests.cluster up` builds (cached) and starts etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kwok with a fake GPU node pool, and the KubeRay operator. See
docs/operations/local-cluster.md. Tests get it through the fixtures in tests/cluster/fixtures.py.
"""
