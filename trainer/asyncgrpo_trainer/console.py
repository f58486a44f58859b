"""What `asyncgrpo run` shows a person: a progress bar while it trains and a summary at the end.

On a terminal the bar is one line redrawn in place; in a log file or a pipe it is a plain line at
every tenth of the run, so the file stays readable. Machine-readable step records are not shown
here: `asyncgrpo run --jsonl FILE` writes them (progress.JsonLines).
"""

from __future__ import annotations

import time
from typing import Any, TextIO

BAR_WIDTH = 24
LINES_PER_RUN = 10
"""Without a terminal, one line per tenth of the run (and the last step)."""

ACCURACY_KEYS = (("accuracy", "accuracy"), ("validation_accuracy", "validation accuracy"))
"""Progress keys shown when the environment reports them (key, label)."""


def duration(seconds: float) -> str:
    """3.2 s, 4 min 05 s, 1 h 02 min."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def _number(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


class HumanProgress:
    """The bar (step/max, reward, accuracy when reported, samples/s, ETA) and the final summary."""

    def __init__(self, stream: TextIO, *, checkpoints: str | None = None, tty: bool | None = None) -> None:
        self.stream = stream
        self.checkpoints = checkpoints
        self.tty = stream.isatty() if tty is None else tty
        self.started = time.monotonic()
        """Includes Ray's and the workers' start-up (the summary's total time)."""
        self._first: tuple[float, int, float] | None = None
        """(time, step, samples trained) at the first update: rates and the ETA count from there."""
        self._last: dict[str, Any] = {}
        self._last_at = 0.0
        self._rewards: list[tuple[int, float]] = []
        self._drawn = False
        self._written = -1
        """The last step written as a line (no terminal)."""
        self._next_line = 0
        """The step that earns the next line; the first update is the baseline, except at the end."""

    def update(self, progress: dict[str, Any], records: list[dict[str, Any]]) -> None:
        now = time.monotonic()
        samples = float(progress.get("counters", {}).get("samples_trained", 0.0))
        if self._first is None:
            self._first = (now, int(progress["step"]), samples)
            self._next_line = int(progress["step"]) + 1
        self._last, self._last_at = progress, now
        self._rewards += [
            (int(r["step"]), float(r["reward_mean"])) for r in records if r.get("reward_mean") is not None
        ]
        step, total = int(progress["step"]), max(int(progress["max_steps"]), 1)
        line = self._line()
        if self.tty:
            self.stream.write("\r" + line + "\x1b[K")
            self._drawn = True
        elif step > self._written and (step >= self._next_line or step >= total):
            # A run over before the first poll still ends with its full bar.
            self.stream.write(line + "\n")
            self._written, self._next_line = step, step + max(total // LINES_PER_RUN, 1)
        self.stream.flush()

    def _line(self) -> str:
        """The bar for the last update, as of its time."""
        assert self._first is not None
        t0, step0, samples0 = self._first
        step, total = int(self._last["step"]), max(int(self._last["max_steps"]), 1)
        samples = float(self._last.get("counters", {}).get("samples_trained", 0.0))
        elapsed = self._last_at - t0
        filled = BAR_WIDTH * min(step, total) // total
        parts = [f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {step}/{total}"]
        parts.append(f"reward {_number(self._last.get('reward_mean'))}")
        for key, label in ACCURACY_KEYS:
            if self._last.get(key) is not None:
                parts.append(f"{label} {_number(self._last[key], 2)}")
        if elapsed > 0 and samples > samples0:
            parts.append(f"{(samples - samples0) / elapsed:.0f} samples/s")
        if step > step0 and step < total:
            parts.append(f"ETA {duration((total - step) * elapsed / (step - step0))}")
        return "  ".join(parts)

    def end(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False

    def _settle(self, summary: dict[str, Any]) -> None:
        """Redraw the bar once more when the run's final validation came after its last update, so
        that the bar's last line and the summary show the same accuracy (they showed step 50's and
        step 60's)."""
        final = {key: summary[key] for key, _ in ACCURACY_KEYS if summary.get(key) is not None}
        if self._first is None or all(self._last.get(k) == v for k, v in final.items()):
            return
        self._last = {**self._last, **final}
        if not self.tty:
            self.stream.write(self._line() + "\n")
        elif self._drawn:  # still the current line: redraw it in place and end it
            self.stream.write("\r" + self._line() + "\x1b[K\n")
            self._drawn = False
        else:  # `end` moved below it: up one line, redraw, back down
            self.stream.write("\x1b[A\r" + self._line() + "\x1b[K\n")

    def summary(self, summary: dict[str, Any]) -> None:
        """A few aligned lines: what was trained, how well, how fast, and where it was saved."""
        self._settle(summary)
        last = self._last
        steps, total = int(summary.get("steps", last.get("step", 0))), int(last.get("max_steps", 0))
        mode = f" ({last['mode']})" if last.get("mode") else ""
        wall = float(summary.get("wall_seconds", 0.0))
        lines = [
            f"trained {steps}/{total or steps} steps{mode} in {duration(wall)} "
            f"({duration(time.monotonic() - self.started)} with start-up)"
        ]
        if self._rewards:
            (s0, r0), (s1, r1) = self._rewards[0], self._rewards[-1]
            lines.append(f"  reward              {r0:.3f} at step {s0} -> {r1:.3f} at step {s1}")
        validation = summary.get("validation_reward", last.get("validation_reward"))
        if validation is not None:
            lines.append(f"  validation reward   {validation:.3f}")
        for key, label in ACCURACY_KEYS:
            value = summary.get(key, last.get(key))
            if value is not None:
                lines.append(f"  {label:<19} {value:.3f}")
        if summary.get("samples_per_second"):
            lines.append(
                f"  throughput          {summary['samples_per_second']:.1f} samples/s "
                f"({summary.get('samples', 0):.0f} samples)"
            )
        if last.get("mean_staleness") is not None:
            lines.append(f"  staleness           {last['mean_staleness']:.2f} versions (last step)")
        saved = last.get("last_checkpoint_step")
        if saved is not None:
            where = f" in {self.checkpoints}" if self.checkpoints else ""
            lines.append(f"  checkpoint          step {saved}{where}")
        self.stream.write("\n".join(lines) + "\n")
        self.stream.flush()
