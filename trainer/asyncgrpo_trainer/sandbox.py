"""Running a tool call (a piece of Python) in a sandboxed subprocess.

A tool call is text the policy wrote: code that may do anything, hostile or broken. It runs in a
fresh `python -I -S` child started without a shell, in its own session and an empty working
directory, with an empty environment, and before the call's code runs the child locks itself in:

- network: it moves into a new, empty network namespace (unshare(2) CLONE_NEWNET; as a user other
  than root together with CLONE_NEWUSER), where no interface but a down loopback exists, so no
  packet leaves it. Where the kernel refuses (a container without the capability and without user
  namespaces) the audit hook below still refuses every socket; `Report.network` says which held.
- privileges: started as root it becomes `nobody`, so the process limit binds (root is exempt) and
  no file of the host's users is writable. A few modules a calculation may want (math, fractions,
  decimal, statistics, re, ...) are imported before, since `nobody` may not be able to read the
  interpreter's library (a Python installed under /root).
- limits (setrlimit): CPU seconds (SIGXCPU at the limit, SIGKILL a second later), address space
  (memory), no new processes, a small file size (its output is a file, so a flood of output is
  cut) and few open files.
- an audit hook (PEP 578) refuses, from then on, sockets, new processes (fork, exec, spawn,
  subprocess, system), signals to other processes and ctypes: the second line behind the namespace
  and the process limit, since audit hooks cannot be removed from Python code.

The parent waits at most `Limits.wall_seconds` (a call may sleep without using CPU), then kills the
child's whole process group; it reads at most `Limits.output_bytes` of output. Nothing the call
does reaches the process that runs it: it shares no memory with it, cannot signal it and cannot
outlive it. Every call ends in one `Outcome`, which the caller counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from enum import StrEnum
from pathlib import Path


class Outcome(StrEnum):
    """How a tool call ended."""

    OK = "ok"
    ERROR = "error"
    """The code raised (a syntax error, a division by zero, ...)."""
    BLOCKED = "blocked"
    """The code tried something the sandbox refuses (a socket, a new process, ctypes)."""
    MEMORY = "memory"
    """The code asked for more memory than Limits.memory_bytes."""
    TIMEOUT = "timeout"
    """The code ran past Limits.cpu_seconds of CPU or Limits.wall_seconds of wall time."""
    KILLED = "killed"
    """The child died of a signal other than the CPU limit's (e.g. its output passed the size limit)."""


@dataclass(frozen=True)
class Limits:
    """What one tool call may use."""

    cpu_seconds: int = 2
    wall_seconds: float = 5.0
    memory_bytes: int = 512 * 2**20
    """Address space: Python itself needs about 30 MB of it."""
    output_bytes: int = 4096
    open_files: int = 32


@dataclass(frozen=True)
class Report:
    """The result of one tool call."""

    outcome: Outcome
    output: str
    """What the code printed (an expression's value is printed), or the error's last line."""
    network: str
    """How the network was cut: "namespace" (unshare) or "audit-hook" (the namespace was refused)."""


_EXIT_ERROR, _EXIT_BLOCKED, _EXIT_MEMORY = 3, 4, 5
_NETWORK_FLAG = "ASYNCGRPO_SANDBOX_NETWORK:"

_CHILD = (
    r"""
import ctypes, json, os, resource, sys
import cmath, decimal, fractions, functools, itertools, math, operator, re, statistics, string
limits = json.loads(sys.argv[1])
code = sys.stdin.read()
CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
root = os.geteuid() == 0
libc = ctypes.CDLL(None, use_errno=True)
flags = CLONE_NEWNET if root else CLONE_NEWUSER | CLONE_NEWNET
network = "namespace" if libc.unshare(flags) == 0 else "audit-hook"
if root:
    os.setgroups([])
    os.setgid(65534)
    os.setuid(65534)
for name, value in (
    ("RLIMIT_CPU", (limits["cpu_seconds"], limits["cpu_seconds"] + 1)),
    ("RLIMIT_AS", (limits["memory_bytes"],) * 2),
    ("RLIMIT_NPROC", (0, 0)),
    ("RLIMIT_FSIZE", (limits["output_bytes"] * 4,) * 2),
    ("RLIMIT_NOFILE", (limits["open_files"],) * 2),
    ("RLIMIT_CORE", (0, 0)),
):
    resource.setrlimit(getattr(resource, name), value)
sys.stderr.write("%s%s\n" % (sys.argv[2], network))
sys.stderr.flush()
del libc, ctypes
sys.modules.pop("ctypes", None)
REFUSED = ("socket.", "subprocess.", "os.fork", "os.forkpty", "os.exec", "os.posix_spawn", "os.spawn",
           "os.system", "os.kill", "os.killpg", "signal.pthread_kill", "ctypes.", "os.setsid", "pty.")
NO_IMPORT = ("_ctypes", "ctypes", "_posixsubprocess")
class Refused(Exception):
    pass
def hook(event, args):
    if event.startswith(REFUSED) or event == "import" and args[0] in (NO_IMPORT):
        raise Refused("the sandbox refuses " + event)
sys.addaudithook(hook)
try:
    try:
        compiled, expression = compile(code, "<tool>", "eval"), True
    except SyntaxError:
        compiled, expression = compile(code, "<tool>", "exec"), False
    env = {"__builtins__": __builtins__}
    value = eval(compiled, env) if expression else exec(compiled, env)
    if expression:
        print(value)
except Refused as exc:
    sys.stderr.write("%s\n" % exc)
    os._exit(EXIT_BLOCKED)
except MemoryError:
    sys.stderr.write("MemoryError\n")
    os._exit(EXIT_MEMORY)
except BaseException as exc:
    sys.stderr.write("%s: %s\n" % (type(exc).__name__, exc))
    os._exit(EXIT_ERROR)
sys.stdout.flush()
""".replace("EXIT_BLOCKED", str(_EXIT_BLOCKED))
    .replace("EXIT_MEMORY", str(_EXIT_MEMORY))
    .replace("EXIT_ERROR", str(_EXIT_ERROR))
)


def run(code: str, limits: Limits) -> Report:
    """Run `code` in a new sandboxed child and report how it ended (module docstring)."""
    with tempfile.TemporaryDirectory(prefix="asyncgrpo-tool-") as tmp:
        os.chmod(tmp, 0o777)
        out_path, err_path = Path(tmp) / "out", Path(tmp) / "err"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            child = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", _CHILD, json.dumps(asdict(limits)), _NETWORK_FLAG],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=tmp,
                env={},
                start_new_session=True,
                close_fds=True,
            )
            timed_out = False
            try:
                child.communicate(code.encode(), timeout=limits.wall_seconds)
            except subprocess.TimeoutExpired:
                timed_out = True
            finally:
                _kill_group(child.pid)
                child.wait()
        output = _head(out_path, limits.output_bytes)
        errors = _head(err_path, limits.output_bytes).splitlines()
    network = next((e[len(_NETWORK_FLAG) :] for e in errors if e.startswith(_NETWORK_FLAG)), "audit-hook")
    errors = [e for e in errors if not e.startswith(_NETWORK_FLAG)]
    outcome = _outcome(child.returncode, timed_out=timed_out)
    return Report(
        outcome, output.strip() if outcome is Outcome.OK else (errors[-1] if errors else ""), network
    )


def _outcome(returncode: int, *, timed_out: bool) -> Outcome:
    if timed_out or returncode == -signal.SIGXCPU:
        return Outcome.TIMEOUT
    if returncode < 0:
        return Outcome.KILLED
    return {
        0: Outcome.OK,
        _EXIT_BLOCKED: Outcome.BLOCKED,
        _EXIT_MEMORY: Outcome.MEMORY,
    }.get(returncode, Outcome.ERROR)


def _kill_group(pgid: int) -> None:
    """SIGKILL every process left in the child's session (its process group is its pid)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _head(path: Path, limit: int) -> str:
    with path.open("rb") as f:
        return f.read(limit).decode("utf-8", "replace")
