"""The environment through which the operator hands the object store's credentials and CA bundle
to the trainer: one definition for the operator (which renders it) and the trainer (which reads it).

Why environment and not the spec: the spec is stored in a ConfigMap and printed in logs; the keys
stay in their Secret and reach the containers only as `secretKeyRef` variables.
"""

from __future__ import annotations

ACCESS_KEY_ENV = "AWS_ACCESS_KEY_ID"
SECRET_KEY_ENV = "AWS_SECRET_ACCESS_KEY"
CREDENTIAL_ENV = (ACCESS_KEY_ENV, SECRET_KEY_ENV)
CA_BUNDLE_ENV = "AWS_CA_BUNDLE"
"""The CA bundle's file, which boto3 reads on its own (set only when a bundle is mounted)."""
CA_BUNDLE_DIR = "/etc/asyncgrpo/object-store-ca"
"""Where the ConfigMap of spec.storage.objectStore.tls.caConfigMap is mounted."""
CA_VOLUME = "object-store-ca"
