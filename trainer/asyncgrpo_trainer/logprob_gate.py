"""The log-prob gate: does the generation engine sample the distribution the policy trains on?

Each step measures `gen_logprob_error` (NeMo-RL's token_mult_prob_error: the mean over the tokens
that the step's own weights generated of exp|log pi_engine - log pi_policy|, 1 when they agree;
`algorithms.losses`). A value that stays above spec.trainer.logprobGate.threshold (NeMo-RL's bar is
1.1 in bf16) for `steps` measured steps in a row means the engine and the policy disagree (a wrong
refit, a precision or kernel mismatch, a sampler the policy does not reproduce): the controller
publishes a one-line `mismatch` in /progress, from which the operator sets the job's
LogprobMismatch condition (with an Event), and with `failJob` the run stops with
`LogprobMismatchError` (exit 1, not retried). A step without a measurement (no sample of its own
weights) neither extends nor breaks the streak; a measured step at or below the threshold ends it.
"""

from __future__ import annotations

from dataclasses import dataclass


class LogprobMismatchError(RuntimeError):
    """The gate tripped and logprobGate.failJob is true."""


@dataclass(frozen=True)
class GateSettings:
    threshold: float | None
    """None: the gate is off."""
    steps: int = 5
    fail: bool = False


@dataclass
class LogprobGate:
    settings: GateSettings
    count: int = 0
    """Measured steps above the threshold in a row, up to the latest measured step."""
    first: int = 0
    last: int = 0
    latest: float = 0.0
    peak: float = 0.0

    def observe(self, step: int, error: float | None) -> None:
        """Count step `step`'s measurement; raises LogprobMismatchError when the gate trips with
        failJob set."""
        threshold = self.settings.threshold
        if threshold is None or error is None:
            return
        if error <= threshold:
            self.count = 0
            return
        if not self.count:
            self.first, self.peak = step, error
        self.count += 1
        self.last, self.latest, self.peak = step, error, max(self.peak, error)
        if self.tripped and self.settings.fail:
            raise LogprobMismatchError(f"{self.mismatch}; logprobGate.failJob is set")

    @property
    def tripped(self) -> bool:
        return self.settings.threshold is not None and self.count >= self.settings.steps

    @property
    def mismatch(self) -> str | None:
        """One line for /progress while tripped (the operator's condition message), else None."""
        if not self.tripped:
            return None
        return (
            f"genLogprobError above logprobGate.threshold {self.settings.threshold:g} for "
            f"{self.count} measured steps in a row (steps {self.first}-{self.last}; latest "
            f"{self.latest:.4f}, highest {self.peak:.4f}): the generation engine does not sample the "
            "policy's distribution"
        )
