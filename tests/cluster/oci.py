"""Single-layer OCI image archives written from host files, for `ctr images import`.

Why: the real node pulls nothing (no registry is reachable), so every image it runs is imported
from an archive. The small ones the cluster itself needs, the pod sandbox's `pause` and the
busybox the node's tests run, are a few static binaries in a FROM-scratch layer; this writes them
in the OCI image layout (uncompressed layer, linux/amd64) without any image-building tool.
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

LOCAL_REGISTRY = "localhost/asyncgrpo"
"""Prefix of locally made image names: `localhost/` is never a pullable registry here."""
_MEDIA = "application/vnd.oci.image"


def _blob(tar: tarfile.TarFile, data: bytes, media_type: str) -> dict[str, Any]:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))
    return {"mediaType": media_type, "digest": f"sha256:{digest}", "size": len(data)}


def _layer(files: dict[str, Path], links: dict[str, str]) -> bytes:
    """A layer tar: `files` copied (mode kept, owner root), `links` as symlinks, with parents."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        dirs = sorted({str(Path(p).parent) for p in [*files, *links]} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            tar.addfile(info)
        for dest, src in sorted(files.items()):
            info = tar.gettarinfo(str(src), dest)
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            with src.open("rb") as fh:
                tar.addfile(info, fh)
        for dest, target in sorted(links.items()):
            info = tarfile.TarInfo(dest)
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            tar.addfile(info)
    return buf.getvalue()


def write_image(
    out: Path,
    name: str,
    files: dict[str, Path],
    *,
    entrypoint: list[str],
    links: dict[str, str] | None = None,
) -> None:
    """Write an OCI archive of one image named `name` whose only layer holds `files` (paths in
    the image, relative to /) and `links` (symlink path -> target)."""
    layer = _layer(files, links or {})
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin"]},
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{hashlib.sha256(layer).hexdigest()}"]},
    }
    tmp = out.with_suffix(".tmp")
    with tarfile.open(tmp, "w") as tar:
        layer_desc = _blob(tar, layer, f"{_MEDIA}.layer.v1.tar")
        config_desc = _blob(tar, json.dumps(config).encode(), f"{_MEDIA}.config.v1+json")
        manifest = {
            "schemaVersion": 2,
            "mediaType": f"{_MEDIA}.manifest.v1+json",
            "config": config_desc,
            "layers": [layer_desc],
        }
        manifest_desc = _blob(tar, json.dumps(manifest).encode(), f"{_MEDIA}.manifest.v1+json")
        manifest_desc["annotations"] = {"io.containerd.image.name": name}
        manifest_desc["platform"] = {"architecture": "amd64", "os": "linux"}
        index = {"schemaVersion": 2, "mediaType": f"{_MEDIA}.index.v1+json", "manifests": [manifest_desc]}
        for fname, data in (("oci-layout", {"imageLayoutVersion": "1.0.0"}), ("index.json", index)):
            raw = json.dumps(data).encode()
            info = tarfile.TarInfo(fname)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    tmp.replace(out)
