"""`asyncgrpo plot RUN_DIR... -o curves.png`: accuracy and reward against trained samples.

A RUN_DIR is a job's checkpoint path (or its `tensorboard` directory, or any directory holding a
run's TensorBoard event files, `tracking`); each is one run, labelled with its directory name (or
`--label`). A run may also be a job's root in spec.storage.objectStore,
`s3://BUCKET/<prefix>/<namespace>/<job name>`, read after the pods and the volume are gone: every
attempt's event files are fetched from its logs/ (`fetch_curves`), with the key pair in
AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY, a private CA in AWS_CA_BUNDLE, and the endpoint from
`--endpoint` or AWS_ENDPOINT_URL.

Two panels: exact-match accuracy (held-out greedy as lines with markers, the training
samples' as thin lines of the same color) and the mean reward of the training samples.
The x axis is trained samples, so runs with different asynchrony compare at equal data.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from botocore.exceptions import BotoCoreError, ClientError

if TYPE_CHECKING:
    from asyncgrpo_trainer.object_store import Store

EVENTS_PREFIX = "events.out.tfevents."
STORE_SCHEME = "s3://"
ENDPOINT_ENV = "AWS_ENDPOINT_URL"
"""boto3's own variable for the endpoint, so one setting serves this command and the AWS CLI."""


@dataclass(frozen=True)
class Run:
    """One run's curves, each a list of (trained samples, value)."""

    label: str
    accuracy: list[tuple[float, float]]
    validation_accuracy: list[tuple[float, float]]
    reward: list[tuple[float, float]]


def event_dir(path: Path) -> Path:
    """The directory with the run's event files: `path` itself, or the one directory below it."""
    if any(p.name.startswith(EVENTS_PREFIX) for p in path.glob("*")):
        return path
    found = sorted({p.parent for p in path.rglob(f"{EVENTS_PREFIX}*")})
    if not found:
        raise FileNotFoundError(f"{path}: no TensorBoard event files in it or below it")
    if len(found) > 1:
        raise ValueError(
            f"{path}: event files in several directories ({', '.join(map(str, found))}); name one"
        )
    return found[0]


def event_files(directory: Path) -> list[Path]:
    """The directory's event files, oldest first: by the writer's start second, then its process and
    its number within the process (`events.out.tfevents.<second>.<host>.<pid>.<n>`), compared as
    numbers. TensorBoard reads a directory's files in text order, where one process's 10th writer
    sorts before its 9th: when both started in one second, a resumed run's older values were read
    last and won (a CI run's flake of 2026-12-07 that a repro with the counter at 9 shows)."""

    def order(file: Path) -> tuple[int, ...]:
        parts = file.name.removeprefix(EVENTS_PREFIX).split(".")
        numbers = (parts[0], *parts[-2:]) if len(parts) >= 3 else parts[:1]
        return tuple(int(part) if part.isdigit() else 0 for part in numbers)

    return sorted((f for f in directory.iterdir() if f.name.startswith(EVENTS_PREFIX)), key=order)


def store_location(url: str) -> tuple[str, str]:
    """(bucket, the job's root) of `s3://BUCKET/<prefix>/<namespace>/<job name>`."""
    bucket, _, root = url.removeprefix(STORE_SCHEME).partition("/")
    root = root.strip("/")
    if not bucket or not root:
        raise ValueError(
            f"{url}: expected s3://BUCKET/<prefix>/<namespace>/<job name>, the job's root under "
            "spec.storage.objectStore (its bucket, then its prefix if any)"
        )
    return bucket, root


def fetch_curves(store: Store, into: Path) -> Path:
    """Every attempt's TensorBoard event files (logs/attempt-N/tensorboard/), side by side in `into`.

    Their names carry the writer's start time, so they load oldest first and a step that a resumed
    attempt trained again takes the newer attempt's value, as in a local run's directory. A file
    that two attempts uploaded (the volume survived) is the same file: the newer upload is kept."""
    keys = sorted(
        key
        for key in store.list_keys("logs/")
        if "/tensorboard/" in key and PurePosixPath(key).name.startswith(EVENTS_PREFIX)
    )
    if not keys:
        config = store.config
        raise FileNotFoundError(
            f"s3://{config.bucket}/{config.root}/logs/ at {config.endpoint}: no TensorBoard event files "
            "(the driver uploads them every logUploadIntervalSeconds and at its end)"
        )
    into.mkdir(parents=True, exist_ok=True)
    for key in keys:
        store.download_file(key, into / PurePosixPath(key).name)
    return into


def load_from_store(url: str, endpoint: str, region: str, into: Path, label: str | None = None) -> Run:
    """The curves of the job whose root in the object store is `url` (see the module's docstring)."""
    from asyncgrpo_api.object_store_env import CA_BUNDLE_ENV  # noqa: PLC0415
    from asyncgrpo_trainer.object_store import Store, StoreConfig  # noqa: PLC0415 (boto3: only here)

    bucket, root = store_location(url)
    config = StoreConfig(
        endpoint=endpoint.rstrip("/"),
        bucket=bucket,
        root=root,
        region=region,
        verify=os.environ.get(CA_BUNDLE_ENV) or True,
    )
    return load(fetch_curves(Store(config), into), label or PurePosixPath(root).name)


def load(path: Path, label: str | None = None) -> Run:
    """The curves of the run under `path` (the steps a resumed attempt trained again count once)."""
    from tensorboard.backend.event_processing import event_accumulator  # noqa: PLC0415 (heavy)

    directory = event_dir(path)
    merged: dict[str, dict[int, float]] = {}
    for file in event_files(directory):
        acc = event_accumulator.EventAccumulator(str(file), size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        scalars = {tag: {e.step: e.value for e in acc.Scalars(tag)} for tag in acc.Tags()["scalars"]}
        first = min((step for values in scalars.values() for step in values), default=None)
        for tag, values in merged.items():  # a resumed writer's steps replace the older ones from its first
            merged[tag] = {s: v for s, v in values.items() if first is None or s < first}
        for tag, values in scalars.items():
            merged.setdefault(tag, {}).update(values)

    def series(tag: str) -> dict[int, float]:
        return merged.get(tag, {})

    samples = series("train/samples")
    if not samples:
        raise ValueError(f"{directory}: no train/samples scalar (not written by the asyncgrpo driver?)")

    def against_samples(tag: str) -> list[tuple[float, float]]:
        return sorted((samples[s], v) for s, v in series(tag).items() if s in samples)

    name = directory.parent.name if directory.name == "tensorboard" else directory.name
    return Run(
        label=label or name,
        accuracy=against_samples("train/accuracy"),
        validation_accuracy=against_samples("val/accuracy"),
        reward=against_samples("train/reward"),
    )


def draw(runs: list[Run], out: Path, *, title: str | None = None) -> None:
    import matplotlib  # noqa: PLC0415 (heavy; only this command needs it)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    fig, (ax_acc, ax_rew) = plt.subplots(1, 2, figsize=(10, 3.8), dpi=80)
    for i, run in enumerate(runs):
        color = f"C{i}"
        if run.validation_accuracy:
            x, y = zip(*run.validation_accuracy, strict=True)
            ax_acc.plot(x, y, "-o", color=color, markersize=3, label=run.label)
        if run.accuracy:
            x, y = zip(*run.accuracy, strict=True)
            # Labelled here only when the run has no held-out line to carry its label.
            label = None if run.validation_accuracy else run.label
            ax_acc.plot(x, y, "-", color=color, alpha=0.3, linewidth=1, label=label)
        if run.reward:
            x, y = zip(*run.reward, strict=True)
            ax_rew.plot(x, y, "-", color=color, linewidth=1.2, label=run.label)
    ax_acc.set(
        xlabel="trained samples",
        ylabel="exact-match accuracy",
        ylim=(-0.02, 1.02),
        title="held-out, greedy (thin: the training samples)",
    )
    ax_rew.set(xlabel="trained samples", ylabel="mean reward", ylim=(-0.02, 1.02), title="training samples")
    for ax in (ax_acc, ax_rew):
        ax.grid(alpha=0.3)
    ax_acc.legend(fontsize=8, loc="upper left")
    ax_rew.legend(fontsize=8, loc="upper left")
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="asyncgrpo plot", description=__doc__.split("\n")[0])
    parser.add_argument(
        "runs",
        nargs="+",
        help="run directories (a job's checkpoint path), or s3://BUCKET/<prefix>/<namespace>/<job name>",
    )
    parser.add_argument("-o", "--out", type=Path, default=Path("curves.png"), help="PNG to write")
    parser.add_argument("--label", action="append", default=[], help="a label per run, in order")
    parser.add_argument("--title", default=None, help="figure title")
    parser.add_argument(
        "--endpoint",
        default=os.environ.get(ENDPOINT_ENV),
        help=f"the object store URL for s3:// runs (spec.storage.objectStore.endpoint; ${ENDPOINT_ENV})",
    )
    parser.add_argument("--region", default="us-east-1", help="the region s3:// requests are signed for")
    ns = parser.parse_args(argv)
    stored = [run for run in ns.runs if run.startswith(STORE_SCHEME)]
    if stored and not ns.endpoint:
        parser.error(f"{stored[0]}: name the object store with --endpoint URL or {ENDPOINT_ENV}")
    if ns.label and len(ns.label) != len(ns.runs):
        parser.error(f"--label given {len(ns.label)} times for {len(ns.runs)} runs")
    labels = ns.label or [None] * len(ns.runs)
    with tempfile.TemporaryDirectory(prefix="asyncgrpo-plot-") as fetched:
        try:
            runs = [
                load_from_store(run, ns.endpoint, ns.region, Path(fetched) / str(i), label)
                if run.startswith(STORE_SCHEME)
                else load(Path(run), label)
                for i, (run, label) in enumerate(zip(ns.runs, labels, strict=True))
            ]
        except (OSError, ValueError) as exc:
            print(f"asyncgrpo plot: {exc}", file=sys.stderr)
            return 1
        except (BotoCoreError, ClientError) as exc:  # a refused key pair, no such bucket, no server
            print(
                f"asyncgrpo plot: the object store {ns.endpoint} refused the read: {exc} (set "
                "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY to a key pair that may read the bucket)",
                file=sys.stderr,
            )
            return 1
    draw(runs, ns.out, title=ns.title)
    print(f"wrote {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
