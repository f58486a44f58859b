"""The calculator's sandbox: a hostile tool call (a fork bomb, a 10 GB allocation, a socket to the
network) is contained, ends in an outcome the run counts, and leaves nothing behind; an ordinary
call still computes (`sandbox`, `envs.calculator`)."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
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


NOBODY = 65534
AS_NOBODY = ["setpriv", "--reuid", str(NOBODY), "--regid", str(NOBODY), "--clear-groups"]
_CALLS_AS_NOBODY = """
import json, sys
sys.path.insert(0, sys.argv[1])
import sandbox
limits = sandbox.Limits(cpu_seconds=1, wall_seconds=4.0, memory_bytes=256 * 2**20)
print(json.dumps([sandbox.run(code, limits).__dict__ for code in json.loads(sys.argv[2])]))
"""


_RUNS_ITSELF = (
    "import subprocess, sys; assert sys.version_info >= (3, 11); "
    "subprocess.run([sys.executable, '-I', '-S', '-c', 'pass'], check=True)"
)


def _interpreter_for(user: list[str]) -> str | None:
    """A Python of 3.11 or later that `user` may run and that may start itself again (as the
    sandbox does): this one unless it lies where only root reads (a pyenv under /root, as on the
    CI machine), else the system's."""
    for candidate in (sys.executable, "/usr/bin/python3", "/usr/local/bin/python3"):
        real = os.path.realpath(candidate)
        check = [*user, real, "-I", "-c", _RUNS_ITSELF]
        if (
            os.path.isfile(real)
            and subprocess.run(check, capture_output=True, timeout=60, check=False).returncode == 0
        ):
            return real
    return None


@pytest.mark.skipif(sandbox.landlock_abi() < 1, reason="the kernel has no Landlock")
def test_a_non_root_tool_call_cannot_write_the_checkpoints_its_own_user_owns() -> None:
    """As the trainer image runs (uid 1000, not root, so no switch to `nobody`): the checkpoint
    directory belongs to the very user the call runs as, and only Landlock keeps the call out."""
    user = AS_NOBODY if os.geteuid() == 0 else []
    python = _interpreter_for(user)
    if python is None:
        pytest.skip("no Python 3.11 that a non-root user may run")
    # Under /tmp, not TMPDIR: pytest's folders and `make test`'s TMPDIR (mkdtemp: mode 700) only root enters.
    base = Path(tempfile.mkdtemp(prefix="asyncgrpo-sandbox-", dir="/tmp"))
    try:
        os.chmod(base, 0o755)
        lib, home, step = base / "lib", base / "home", base / "ckpt" / "step-00000001"
        lib.mkdir()
        shutil.copy(sandbox.__file__, lib / "sandbox.py")  # the module alone: the standard library only
        home.mkdir()
        step.mkdir(parents=True)
        state = step / "state.pt"
        state.write_bytes(b"the controller's state")
        if user:
            for path in (home, base / "ckpt", step, state):
                os.chown(path, NOBODY, NOBODY)
        calls = [
            f"open({str(state)!r}, 'wb').write(b'payload')",
            f"open({str(step / 'policy.pt')!r}, 'x').write('payload')",
            f"__import__('os').remove({str(state)!r})",
            "open('scratch', 'w').write('kept'); print(open('scratch').read())",
        ]
        done = subprocess.run(
            [*user, python, "-I", "-c", _CALLS_AS_NOBODY, str(lib), json.dumps(calls)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env={"TMPDIR": str(home), "PATH": os.environ.get("PATH", "")},
            cwd=home,
        )
        assert done.returncode == 0, done.stderr
        *outside, own = json.loads(done.stdout)
        assert state.read_bytes() == b"the controller's state"
        assert sorted(p.name for p in step.iterdir()) == ["state.pt"]
        assert [(r["outcome"], r["filesystem"]) for r in outside] == [("error", "landlock")] * 3, outside
        assert all("Permission denied" in r["output"] for r in outside), outside
        assert (own["outcome"], own["output"]) == ("ok", "kept")  # its own directory stays writable
    finally:
        shutil.rmtree(base)


def test_without_landlock_no_call_runs_unless_the_job_opts_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "landlock_abi", lambda: 0)  # the kernel's answer on one without it
    with pytest.raises(
        sandbox.SandboxUnavailableError, match=r"no Landlock.*FILESYSTEM=unisolated in spec\.env"
    ):
        sandbox.run("6*7", LIMITS)
    monkeypatch.setenv(sandbox.FILESYSTEM_ENV, "off")
    with pytest.raises(sandbox.SandboxUnavailableError, match="the only value it takes is 'unisolated'"):
        sandbox.run("6*7", LIMITS)
    monkeypatch.setenv(sandbox.FILESYSTEM_ENV, "unisolated")
    report = sandbox.run("6*7", LIMITS)
    assert (report.output, report.filesystem) == ("42", "unisolated")


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
