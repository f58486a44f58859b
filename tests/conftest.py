"""Shared pytest configuration.

The local control plane fixtures (local_cluster, kubeconfig, kube_api, namespace) live in
tests/cluster/fixtures.py; registering them here makes them available to every test folder.
"""

pytest_plugins = ["tests.cluster.fixtures"]
