"""Running a tool call (a piece of Python) in a sandboxed subprocess.

A tool call is text the policy wrote: code that may do anything, hostile or broken. It runs in a
fresh `python -I -S` child started without a shell, in its own session and an empty working
directory, with an empty environment, and before the call's code runs the child locks itself in:

- network: it moves into a new, empty network namespace (unshare(2) CLONE_NEWNET; as a user other
  than root together with CLONE_NEWUSER), where no interface but a down loopback exists, so no
  packet leaves it. Where the kernel refuses (a container without the capability and without user
  namespaces) the audit hook below still refuses every socket; `Report.network` says which held.
- privileges: started as root it becomes `nobody`, so the process limit binds (root is exempt). A
  few modules a calculation may want (math, fractions, decimal, statistics, re, ...) are imported
  before, since `nobody` may not be able to read the interpreter's library (a Python installed
  under /root).
- filesystem: a Landlock ruleset (landlock_restrict_self(2), which no process can lift, for the
  child and anything it would start) makes every path read-only except the call's own empty
  directory, its working directory. The switch to `nobody` does not give this: the trainer image
  runs as uid 1000, the owner of the checkpoints, so without Landlock a call could rewrite
  `step-N/state.pt` or the job's code for the next attempt to run. Where the kernel has no Landlock
  (before Linux 5.13, or the LSM left out of the boot's `lsm=` list; `landlock_abi`) `run` refuses
  to run the call (`SandboxUnavailableError`) unless the job opts out with
  ASYNCGRPO_SANDBOX_FILESYSTEM=unisolated in spec.env; `Report.filesystem` says which held.
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
import ctypes
import functools
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
    filesystem: str
    """How writes were confined: "landlock" (only the call's own directory is writable) or
    "unisolated" (the job opted out: the call writes wherever its uid may)."""


class SandboxUnavailableError(RuntimeError):
    """The sandbox cannot confine a call's writes here, and the job did not opt out: no call runs."""


FILESYSTEM_ENV = "ASYNCGRPO_SANDBOX_FILESYSTEM"
"""Set to "unisolated" (in spec.env) to run tool calls without Landlock where the kernel has none."""
UNISOLATED = "unisolated"
_SYS_LANDLOCK_CREATE_RULESET = 444
"""The same number on every architecture (Landlock's syscalls came after the tables were unified)."""
_LANDLOCK_CREATE_RULESET_VERSION = 1

_EXIT_ERROR, _EXIT_BLOCKED, _EXIT_MEMORY, _EXIT_ISOLATION = 3, 4, 5, 6
_NETWORK_FLAG = "ASYNCGRPO_SANDBOX_NETWORK:"
_ISOLATION_FLAG = "ASYNCGRPO_SANDBOX_ISOLATION:"

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
if sys.argv[3] == "landlock":
    # Handled (so refused unless a rule grants it): writing a file, and removing, creating, linking
    # or renaming anything (REFER, ABI 2) and truncating (ABI 3). Reads are not handled.
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(444, None, 0, 1)
    writes = 0b1111111110010 | (1 << 13 if abi >= 2 else 0) | (1 << 14 if abi >= 3 else 0)
    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]
    handled = ctypes.c_uint64(writes)
    ruleset = libc.syscall(444, ctypes.byref(handled), 8, 0)
    own = PathBeneath(writes, os.open(".", os.O_PATH | os.O_CLOEXEC))
    if not (
        ruleset >= 0
        and libc.syscall(445, ruleset, 1, ctypes.byref(own), 0) == 0
        and libc.prctl(38, 1, 0, 0, 0) == 0  # PR_SET_NO_NEW_PRIVS, which landlock_restrict_self needs
        and libc.syscall(446, ruleset, 0) == 0
    ):
        refused = os.strerror(ctypes.get_errno())
        sys.stderr.write("%sLandlock (ABI %d) refused: %s\n" % (sys.argv[4], abi, refused))
        sys.stderr.flush()
        os._exit(EXIT_ISOLATION)
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
    .replace("EXIT_ISOLATION", str(_EXIT_ISOLATION))
    .replace("EXIT_MEMORY", str(_EXIT_MEMORY))
    .replace("EXIT_ERROR", str(_EXIT_ERROR))
)


@functools.cache
def landlock_abi() -> int:
    """The kernel's Landlock ABI version (1 on Linux 5.13, more with each extension), or 0 where
    there is none: no such syscall (an older kernel, a seccomp profile that refuses it) or the
    LSM not enabled."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, 0, _LANDLOCK_CREATE_RULESET_VERSION)
    return max(int(abi), 0)


def _filesystem() -> str:
    """How this process's calls confine their writes: "landlock", or UNISOLATED where the job
    opted out; raises SandboxUnavailableError where neither applies."""
    chosen = os.environ.get(FILESYSTEM_ENV, "")
    if chosen == UNISOLATED:
        return UNISOLATED
    if chosen:
        raise SandboxUnavailableError(
            f"{FILESYSTEM_ENV}={chosen!r}: the only value it takes is {UNISOLATED!r}"
        )
    if landlock_abi() < 1:
        raise SandboxUnavailableError(
            "tool calls are not run: this kernel has no Landlock (Linux 5.13 or later with landlock "
            "in its LSM list), or the pod's seccomp profile refuses its syscalls, so the sandbox "
            "cannot keep a call from writing the job's checkpoints "
            f"and code; run the job on nodes with Landlock, or set {FILESYSTEM_ENV}={UNISOLATED} in "
            "spec.env to run tool calls with the write access of the trainer's user"
        )
    return "landlock"


def run(code: str, limits: Limits) -> Report:
    """Run `code` in a new sandboxed child and report how it ended (module docstring). Raises
    SandboxUnavailableError, and runs nothing, where the call's writes cannot be confined."""
    filesystem = _filesystem()
    with tempfile.TemporaryDirectory(prefix="asyncgrpo-tool-") as tmp:
        os.chmod(tmp, 0o711)  # `nobody` (a child started as root) only passes through to `own`
        own = Path(tmp) / "own"
        own.mkdir(mode=0o777)
        os.chmod(own, 0o777)  # the umask may have taken bits; the only place the call may write
        out_path, err_path = Path(tmp) / "out", Path(tmp) / "err"
        with out_path.open("wb") as out, err_path.open("wb") as err:
            child = subprocess.Popen(
                [
                    sys.executable,
                    "-I",
                    "-S",
                    "-c",
                    _CHILD,
                    json.dumps(asdict(limits)),
                    _NETWORK_FLAG,
                    filesystem,
                    _ISOLATION_FLAG,
                ],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=err,
                cwd=own,
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
    if child.returncode == _EXIT_ISOLATION:
        refused = next((e[len(_ISOLATION_FLAG) :] for e in errors if e.startswith(_ISOLATION_FLAG)), "")
        raise SandboxUnavailableError(f"tool calls are not run: {refused or 'Landlock refused'}")
    network = next((e[len(_NETWORK_FLAG) :] for e in errors if e.startswith(_NETWORK_FLAG)), "audit-hook")
    errors = [e for e in errors if not e.startswith(_NETWORK_FLAG)]
    outcome = _outcome(child.returncode, timed_out=timed_out)
    return Report(
        outcome,
        output.strip() if outcome is Outcome.OK else (errors[-1] if errors else ""),
        network,
        filesystem,
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
