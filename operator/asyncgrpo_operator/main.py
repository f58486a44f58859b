"""The operator's kopf module: `kopf run -m asyncgrpo_operator.main --all-namespaces`.

Importing it registers every handler with kopf's default registry; it holds no logic.
"""

from asyncgrpo_operator import handlers, kueue_admission, settings, webhook

__all__ = ["handlers", "kueue_admission", "settings", "webhook"]
