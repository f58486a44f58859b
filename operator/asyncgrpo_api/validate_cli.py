"""`asyncgrpo validate FILE...`: the admission rules, offline.

Exit 0 when every job is valid (warnings are printed), 1 when any job is invalid (every error is
printed with its field path and fix), 2 when a file cannot be read or parsed as YAML.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

from asyncgrpo_api.manifests_io import read_documents
from asyncgrpo_api.rules import validate_manifest

EXIT_INVALID = 1
EXIT_UNREADABLE = 2


def main(argv: list[str] | None = None, out: TextIO = sys.stdout) -> int:
    """Validate job files and report like `kubectl apply` would, without a cluster."""
    parser = argparse.ArgumentParser(prog="asyncgrpo validate", description=__doc__)
    parser.add_argument("files", nargs="+", type=Path, help="AsyncGRPOJob YAML files")
    parser.add_argument("-q", "--quiet", action="store_true", help="print only problems")
    args = parser.parse_args(argv)
    status = 0
    for path in args.files:
        for doc in read_documents(path):
            if doc.manifest is None:
                print(f"{doc.label}: error: {doc.error}", file=out)
                status = max(status, EXIT_UNREADABLE)
                continue
            report = validate_manifest(doc.manifest)
            name = (
                doc.manifest.get("metadata", {}).get("name", "?")
                if isinstance(doc.manifest.get("metadata"), dict)
                else "?"
            )
            for warning in report.warnings:
                print(f"{doc.label}: warning: {warning}", file=out)
            for error in report.errors:
                print(f"{doc.label}: error: {error}", file=out)
            if report.ok:
                if not args.quiet:
                    print(f"{doc.label}: AsyncGRPOJob {name} is valid", file=out)
            else:
                print(f"{doc.label}: AsyncGRPOJob {name} is invalid ({len(report.errors)} errors)", file=out)
                status = max(status, EXIT_INVALID)
    return status
