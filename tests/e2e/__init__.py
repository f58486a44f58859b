"""End-to-end tests against the local control plane (tests/cluster)."""
