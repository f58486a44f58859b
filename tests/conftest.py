"""Shared pytest configuration.

The local control plane fixtures (local_cluster, kubeconfig, kube_api, namespace) live in
tests/cluster/fixtures.py, the real S3 server's (s3_server, bucket, store) in
tests/objectstore/fixtures.py; registering them here makes them available to every test folder.
tests/skip_policy.py is `--only-cuda-skips` (CI fails on any skip but "needs a CUDA GPU");
tests/leftovers.py keeps Ray's session folders out of /tmp and lists (`--fail-on-leftovers`: fails
on) any folder a run left there; tests/budget.py is `--test-budget` (CI fails on a test slower than
the budget that does not say why).
"""

pytest_plugins = [
    "tests.cluster.fixtures",
    "tests.e2e.whole_path_fixtures",
    "tests.objectstore.fixtures",
    "tests.skip_policy",
    "tests.leftovers",
    "tests.budget",
]
