"""How long `asyncgrpo run`'s own Ray node takes to start on a loaded machine, and whether it starts.

Issue 45 item 5: a Ray node that "timed out during startup" (Ray's fixed 30 s in node.py) failed CI
runs at load 16-20 and a user's `asyncgrpo run` beside a build. `driver.init_ray` starts such a
node again, for up to `driver.RAY_START_SECONDS`, and logs each slow start as a warning. This
loads the machine with `--busy` processes spinning at the caller's priority (a build's compilers
stand-in), then starts and stops the node `--starts` times the way `asyncgrpo run` does
(`local_run.start_own_ray`), each in a fresh interpreter, as a run is. It prints one line per start
(seconds, attempts, the 1-minute load) and the worst, with the date, load and command for
docs/benchmarks.md. A start that fails every attempt is printed as failed, with Ray's words.

    PYTHONPATH=trainer:operator python bench/trainer/ray_start_under_load.py --busy 16 --starts 3
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import subprocess
import sys
import time

START = """
import json, logging, time
from asyncgrpo_trainer import driver, local_run
attempts = []
class Count(logging.Handler):
    def emit(self, record):
        if "did not start within" in record.getMessage():
            attempts.append(record.getMessage())
driver.log.addHandler(Count())
started = time.monotonic()
try:
    local_run.start_own_ray(num_cpus=2, num_gpus=0)
    outcome = "started"
except Exception as exc:
    outcome = f"failed: {exc}"
seconds = time.monotonic() - started
import ray
ray.shutdown()
print(json.dumps({"seconds": round(seconds, 1), "attempts": len(attempts) + 1, "outcome": outcome}))
"""


def spin() -> None:
    """A busy loop: one core's worth of load until killed."""
    while True:
        pass


def one_start() -> dict[str, object]:
    """One node's start and stop in a fresh interpreter, with the load at its end."""
    out = subprocess.run(
        [sys.executable, "-c", START], capture_output=True, text=True, timeout=600, check=False
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode or not lines:
        return {"outcome": f"crashed ({out.returncode}): {out.stderr[-500:]}"}
    result: dict[str, object] = json.loads(lines[-1])
    result["load"] = round(os.getloadavg()[0], 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--busy", type=int, default=16, help="busy-loop processes beside the starts")
    parser.add_argument("--starts", type=int, default=3, help="node starts, one after the other")
    parser.add_argument("--settle", type=float, default=60.0, help="seconds of load before the first start")
    ns = parser.parse_args()
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(f"{now}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} before; {' '.join(sys.argv)}")
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(ns.busy)]
    for p in spinners:
        p.start()
    try:
        time.sleep(ns.settle)  # the 1-minute load average climbs to the busy count
        results = []
        for i in range(ns.starts):
            result = one_start()
            results.append(result)
            print(f"start {i + 1}: {json.dumps(result)}", flush=True)
    finally:
        for p in spinners:
            p.kill()
    started = [r for r in results if r.get("outcome") == "started"]
    worst = max((float(str(r["seconds"])) for r in started), default=None)
    print(f"{len(started)} of {len(results)} started; slowest {worst} s; most attempts "
          f"{max((int(str(r['attempts'])) for r in started), default=0)}")  # fmt: skip


if __name__ == "__main__":
    main()
