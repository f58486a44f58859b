"""`asyncgrpo plot RUN_DIR... -o curves.png`: accuracy and reward against trained samples.

A RUN_DIR is a job's checkpoint path (or its `tensorboard` directory, or any directory holding a
run's TensorBoard event files, `tracking`); each is one run, labelled with its directory name (or
`--label`). Two panels: exact-match accuracy (held-out greedy as lines with markers, the training
samples' as thin lines of the same color) and the mean reward of the training samples.
The x axis is trained samples, so runs with different asynchrony compare at equal data.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

EVENTS_PREFIX = "events.out.tfevents."


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


def load(path: Path, label: str | None = None) -> Run:
    """The curves of the run under `path` (the steps a resumed attempt trained again count once)."""
    from tensorboard.backend.event_processing import event_accumulator  # noqa: PLC0415 (heavy)

    directory = event_dir(path)
    acc = event_accumulator.EventAccumulator(str(directory), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    tags = set(acc.Tags()["scalars"])

    def series(tag: str) -> dict[int, float]:
        # Later events win: a step logged again after a resume replaces the earlier value.
        return {e.step: e.value for e in acc.Scalars(tag)} if tag in tags else {}

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
            ax_acc.plot(x, y, "-", color=color, alpha=0.3, linewidth=1)
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
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (a job's checkpoint path)")
    parser.add_argument("-o", "--out", type=Path, default=Path("curves.png"), help="PNG to write")
    parser.add_argument("--label", action="append", default=[], help="a label per run, in order")
    parser.add_argument("--title", default=None, help="figure title")
    ns = parser.parse_args(argv)
    if ns.label and len(ns.label) != len(ns.runs):
        parser.error(f"--label given {len(ns.label)} times for {len(ns.runs)} runs")
    labels = ns.label or [None] * len(ns.runs)
    try:
        runs = [load(path, label) for path, label in zip(ns.runs, labels, strict=True)]
    except (OSError, ValueError) as exc:
        print(f"asyncgrpo plot: {exc}", file=sys.stderr)
        return 1
    draw(runs, ns.out, title=ns.title)
    print(f"wrote {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
