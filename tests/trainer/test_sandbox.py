"""The calculator's sandbox: a hostile tool call (a fork bomb, a 10 GB allocation, a socket to the
network) is contained, ends in an outcome the run counts, and leaves nothing behind; an ordinary
call still computes (`sandbox`, `envs.calculator`)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import pytest

from asyncgrpo_trainer import sandbox
from asyncgrpo_trainer.backends import generation, sampling
from asyncgrpo_trainer.conversation import Budget
from asyncgrpo_trainer.envs.base import Example, Score
from asyncgrpo_trainer.envs.calculator import CalculatorEnvironment
from asyncgrpo_trainer.models.tokenizer import PRINTABLE, CharTokenizer
from asyncgrpo_trainer.rollout import Conversations, RolloutManager

LIMITS = sandbox.Limits(cpu_seconds=1, wall_seconds=4.0, memory_bytes=256 * 2**20)
FORK_BOMB = "[__import__('os').fork() for _ in iter(int, 1)]"
TEN_GB = "len(bytearray(10 * 2**30))"
SOCKET = "__import__('socket').create_connection(('1.1.1.1', 53), timeout=3)"
HOSTILE = {
    "fork bomb": (FORK_BOMB, {sandbox.Outcome.BLOCKED}),
    "10 GB": (TEN_GB, {sandbox.Outcome.MEMORY}),
    # BLOCKED by the audit hook where `nobody` can read the interpreter's library; where it cannot
    # (a Python under /root, as on the CI machine) the import itself fails first.
    "socket": (SOCKET, {sandbox.Outcome.BLOCKED, sandbox.Outcome.ERROR}),
}


def _sandbox_processes() -> list[int]:
    """Processes whose command line carries the sandbox's marker: none may outlive a call."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if b"ASYNCGRPO_SANDBOX_NETWORK" in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_tool_call_is_contained_and_ends_in_a_counted_outcome(name: str) -> None:
    code, outcomes = HOSTILE[name]
    report = sandbox.run(code, LIMITS)
    assert report.outcome in outcomes, report
    assert not _sandbox_processes()
    assert sandbox.run("6*7", LIMITS).output == "42"  # the caller is unharmed and calls again


def test_a_call_that_never_ends_is_stopped_by_its_limits() -> None:
    report = sandbox.run("while True: pass", LIMITS)
    assert report.outcome is sandbox.Outcome.TIMEOUT
    assert sandbox.run("__import__('time').sleep(60)", LIMITS).outcome is sandbox.Outcome.TIMEOUT
    assert not _sandbox_processes()


@pytest.mark.skipif(os.geteuid() != 0 and not Path("/proc/self/ns/user").exists(), reason="no namespaces")
def test_a_tool_call_sees_no_network_interface_but_a_loopback() -> None:
    report = sandbox.run("open('/proc/self/net/dev').read()", LIMITS)
    assert report.network == "namespace", report
    interfaces = [line.split(":")[0].strip() for line in report.output.splitlines()[2:]]
    assert interfaces == ["lo"]


def test_the_calculator_answers_a_tool_call_with_its_value_and_a_failed_one_with_a_mark() -> None:
    env = CalculatorEnvironment(LIMITS)
    example = Example("37*58=", "2146")
    assert env.respond(example, ("?37*58",)).content == ">2146"
    failed = env.respond(example, ("?37/0",))
    assert (failed.content, failed.outcome, failed.done) == (">!", "error", False)
    assert env.respond(example, ("?37*58", "2146")).done


class Hostile:
    """An engine whose policy calls the tool with `code`, then answers `1`."""

    def __init__(self, tok: CharTokenizer, code: str) -> None:
        self.turns = [
            [*tok.encode("?" + code, add_bos=False), tok.eos_id],
            [*tok.encode("1", add_bos=False), tok.eos_id],
        ]
        self.version = 0

    async def generate(self, prompt_ids: list[int], n: int, params: Any, seed: int) -> generation.Generated:
        turn = self.turns.pop(0)
        return generation.Generated([turn], [[-0.1] * len(turn)], [True], [0], 0, 0, 0.0)


class Zero:
    async def score(self, example: Any, responses: list[str], finished: list[bool]) -> list[Score]:
        return [Score(0.0, False) for _ in responses]


def test_hostile_tool_calls_in_a_rollout_are_counted_by_outcome_and_the_conversation_goes_on() -> None:
    tok = CharTokenizer(PRINTABLE)
    env = CalculatorEnvironment(LIMITS)

    def group(code: str) -> list[str]:
        manager = RolloutManager(
            Hostile(tok, code),  # type: ignore[arg-type]
            Zero(),  # type: ignore[arg-type]
            tok,
            sampling.SamplingParams(max_new_tokens=120),
            num_generations=1,
            timeout_seconds=None,
            max_attempts=1,
            seed=0,
            conversations=Conversations(env, Budget(max_turns=2, tokens_per_turn=80, max_new_tokens=120)),
        )
        record = asyncio.run(manager.run_group(Example("12*34=", "408"), 0, lambda _: None))
        assert record.finished == [True]  # the policy got the tool's failure mark and answered
        return record.tool_outcomes

    assert group(FORK_BOMB) == ["blocked"]
    assert group(TEN_GB) == ["memory"]
    assert group("12*34") == ["ok"]
