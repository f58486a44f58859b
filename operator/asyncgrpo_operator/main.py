"""The operator's kopf module: `kopf run -m asyncgrpo_operator.main --all-namespaces`, both roles in
one process (`python -m asyncgrpo_operator`, its default `--role all`: local runs and tests).

Importing it registers every handler with kopf's default registry; it holds no logic. The chart
runs the two roles apart (reconciling.py, admission_only.py).
"""

from asyncgrpo_operator import handlers, kueue_admission, settings, webhook

__all__ = ["handlers", "kueue_admission", "settings", "webhook"]
