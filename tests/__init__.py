"""Test suites of asyncgrpo; a package so that `python -m tests.cluster` and `tests.cluster` imports work."""
