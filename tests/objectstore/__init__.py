"""spec.storage.objectStore against a real S3 server (SeaweedFS, tests/objectstore/s3server.py)."""
