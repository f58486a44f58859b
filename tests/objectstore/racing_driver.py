"""A driver's object-store side as its own process, for the fencing test: restore the newest durable
checkpoint, then write a local checkpoint every `--every` seconds (as the controller does) while
`durable_run` mirrors them, until `--steps` more were written or the file `--stop-file` appears.
Prints its mirror's outcome as one JSON line. Two of these on one prefix are two attempts racing.

    python -m tests.objectstore.racing_driver --job JOB.json --attempt N --steps K --every S
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

from asyncgrpo_trainer import checkpoint, driver, durable_run


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--attempt", type=int, required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--every", type=float, default=0.3)
    parser.add_argument("--stop-file", default="")
    parser.add_argument("--payload-mib", type=int, default=0, help="weights of this size (default: small)")
    ns = parser.parse_args()
    job = driver.parse_job(json.loads(Path(ns.job).read_text()))
    root = Path(job.spec.checkpoint.path)
    durable: list[int] = []
    with durable_run.durable_storage(job, ns.attempt, durable.append) as mirror:
        assert mirror is not None
        start = checkpoint.latest(root) or 0
        print(json.dumps({"resumed_from": start}), flush=True)
        for step in range(start + 1, start + ns.steps + 1):
            if ns.stop_file and os.path.exists(ns.stop_file):
                break
            tmp = checkpoint.begin(root, step)
            tag = f"attempt {ns.attempt} step {step}".encode()
            (tmp / "policy.pt").write_bytes(
                tag + os.urandom(ns.payload_mib * 2**20) if ns.payload_mib else tag * 2000
            )
            checkpoint.commit(tmp, step, {"step": step}, keep_last=job.spec.checkpoint.keep_last)
            time.sleep(ns.every)
    print(json.dumps({"start": start, **dataclasses.asdict(mirror.state)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
