"""Code-execution reward: run the model's Python program against test cases in a sandbox.

Reward = fraction of a row's test cases the program passes (R1's "accuracy reward" for code, judged by a
compiler/tests instead of a rule). Rows without tests get ``None`` (the reward does not apply); a completion
without a code block gets 0.

Dataset column ``tests`` (``input_output`` is accepted too, APPS/TACO's name). Per row, either a Python
object or its JSON string (parquet columns often hold JSON):

- stdin/stdout cases: ``[{"input": "1 2\\n", "output": "3\\n"}, ...]`` or APPS' ``{"inputs": [...],
  "outputs": [...]}``. Outputs compare line by line with surrounding whitespace stripped and trailing blank
  lines dropped. APPS' call-based rows (with ``fn_name``) are not supported and score ``None``.
- assert-style cases: ``["assert f(1) == 2", ...]`` or ``{"setup": "import math", "asserts": [...]}``
  (MBPP). Each statement runs after the program in its own process; it passes when the process exits 0 and
  its last stdout line is a per-run random marker printed after the assert, so ``sys.exit(0)`` or
  ``os._exit(0)`` at the top of the program does not pass. (A program that digs the marker out of its
  own code object could still forge it: a sandbox cannot stop a process from lying about itself.)

The program is the last fenced ```python block of the completion (after ``</think>`` when present), else the
last untagged ``` block. After the first timeout of a program its cases not yet started are skipped
(failed), so a hanging program costs one timeout, not one per case.

Sandbox (``sandbox="bwrap"``, default): bubblewrap with new pid/net/ipc/uts namespaces (no network, only a
loopback), an empty root with read-only binds of ``/usr``, ``/lib*``, ``/bin`` and the interpreter's prefixes only
(so ``/work``, ``/root``, ``/home`` do not exist inside), a private size-capped tmpfs ``/tmp`` as the working dir
(the prefixes are bound after it, so a venv under /tmp stays visible), and ``prlimit`` limits (address space, CPU
seconds, processes, file size, open files, no core). ``RLIMIT_NPROC`` does not bind uid 0, so as root the program
runs under a real unprivileged uid (``setpriv``, one uid per concurrent run); as a normal user bwrap maps it into a
user namespace, where the count is per namespace. A wall-clock timeout kills bwrap's process group;
``--die-with-parent`` and the pid namespace take every process of the program with it. At most ``max_output_bytes``
of stdout are read; more kills the program. ``sandbox="rlimit"`` (or env ``R1_CODE_SANDBOX=rlimit``) runs with the
limits but without namespaces: no filesystem or network isolation, and as root without a process bound unless the
interpreter is reachable by an unprivileged uid. Without bwrap the default mode raises with the fix.

The interpreter runs with ``-I -S -B``: isolated, stdlib only (site-packages off: faster start, and code
contest programs use the stdlib); ``allow_site_packages=True`` turns site-packages on.
"""

from __future__ import annotations

import json
import os
import queue
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from grpo_core.rewards.base import completion_text, count_reward_event

NAME = "code_execution"
SANDBOX_ENV = "R1_CODE_SANDBOX"
MAX_COMPLETION_CHARS = 200_000  # only the tail of a completion is searched for code
_UID_BASE = 3_000_000  # unprivileged uids for sandboxed programs run by root (no /etc/passwd entry needed)
_UID_SLOTS = 64


class SandboxUnavailable(RuntimeError):
    """bubblewrap is missing or cannot create its namespaces here."""


@dataclass(frozen=True)
class SandboxLimits:
    timeout: float = 2.0  # wall-clock seconds per test case
    memory_mb: int = 512  # RLIMIT_AS
    max_processes: int = 32  # RLIMIT_NPROC (processes + threads of the sandbox uid)
    max_file_mb: int = 16  # RLIMIT_FSIZE
    max_open_files: int = 64  # RLIMIT_NOFILE
    tmp_mb: int = 64  # size of the private /tmp tmpfs (bwrap mode)
    max_output_bytes: int = 1 << 20  # stdout read at most; more kills the program


@dataclass(frozen=True)
class RunResult:
    returncode: int | None  # None when killed by us (timeout or output cap)
    stdout: str
    stderr: str  # last few KB only
    timed_out: bool
    output_exceeded: bool
    seconds: float


# ---------------------------------------------------------------- extracting code and test cases


def extract_program(text: str) -> str | None:
    """The last ```python (or ```py / ```python3) block, else the last untagged ``` block, else None."""
    text = text[-MAX_COMPLETION_CHARS:]
    if "</think>" in text:
        text = text.rsplit("</think>", 1)[1]
    parts = text.split("```")
    untagged = None
    for i in range(len(parts) - 2 - (len(parts) % 2 == 0), 0, -2):  # odd i = inside a closed fence
        info, _, body = parts[i].partition("\n")
        tag = info.strip().lower()
        if tag in ("python", "py", "python3"):
            return body
        if tag == "" and untagged is None:
            untagged = body
    return untagged


@dataclass(frozen=True)
class TestCase:
    stdin: str = ""
    expected: str | None = None  # stdin/stdout case
    statement: str | None = None  # assert-style case (runs after the program)


def parse_tests(raw: Any) -> list[TestCase] | None:
    """Normalise one row's test column; None when the row has no usable tests."""
    if raw is None:
        return None
    if isinstance(raw, (bytes, str)):
        raw = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
        if not raw.strip():
            return None
        try:
            raw = json.loads(raw)
        except ValueError:
            return [TestCase(statement=raw)]  # a block of asserts
        if isinstance(raw, str):
            return [TestCase(statement=raw)]
    if isinstance(raw, dict):
        if "inputs" in raw and "outputs" in raw:
            if raw.get("fn_name"):
                return None  # APPS call-based: not supported
            raw = [{"input": i, "output": o} for i, o in zip(raw["inputs"], raw["outputs"])]
        elif "asserts" in raw:
            setup = str(raw.get("setup") or "")
            return [TestCase(statement=f"{setup}\n{a}") for a in raw["asserts"]] or None
        else:
            return None
    if not isinstance(raw, (list, tuple)):
        return None
    cases = []
    for item in raw:
        if isinstance(item, str):
            cases.append(TestCase(statement=item))
        elif isinstance(item, dict) and "input" in item and "output" in item:
            cases.append(TestCase(stdin=_join_lines(item["input"]), expected=_join_lines(item["output"])))
    return cases or None


def _join_lines(x: Any) -> str:
    return "\n".join(map(str, x)) if isinstance(x, (list, tuple)) else str(x)


def outputs_match(got: str, expected: str) -> bool:
    """Line-wise comparison ignoring surrounding whitespace and trailing blank lines."""
    a = [line.strip() for line in got.strip().splitlines()]
    b = [line.strip() for line in expected.strip().splitlines()]
    return a == b


# ---------------------------------------------------------------- the sandbox

_SLOTS: queue.Queue[int] = queue.Queue()
for _s in range(_UID_SLOTS):
    _SLOTS.put(_s)
_CHECKED: set[tuple] = set()
_CHECK_LOCK = threading.Lock()


def _slot_uid(slot: int) -> int:
    return _UID_BASE + (os.getpid() % 4096) * _UID_SLOTS + slot


def _tool(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        raise SandboxUnavailable(f"`{name}` (util-linux) not found on PATH; install util-linux")
    return path


def _limit_argv(limits: SandboxLimits) -> list[str]:
    mb = 1 << 20
    return [
        _tool("prlimit"),
        f"--as={limits.memory_mb * mb}",
        f"--cpu={int(limits.timeout) + 1}",
        f"--nproc={limits.max_processes}",
        f"--fsize={limits.max_file_mb * mb}",
        f"--nofile={limits.max_open_files}",
        "--core=0",
        "--",
    ]


def _python_argv(python: str, allow_site_packages: bool, script: str) -> list[str]:
    return [python, "-I", "-B", *([] if allow_site_packages else ["-S"]), script]


def _ro_prefixes(python: str) -> list[str]:
    """Folders the interpreter needs besides /usr, as paths inside the sandbox (each bound read-only from its
    real path): this process's prefix and base prefix, the install prefix of ``python``'s real executable, and
    the venv ``python`` sits in (the folder holding ``pyvenv.cfg``), wherever they live -- /tmp included."""
    candidates = [sys.prefix, sys.base_prefix, str(Path(os.path.realpath(python)).parent.parent)]
    venv = Path(os.path.abspath(python)).parent.parent
    if (venv / "pyvenv.cfg").is_file():  # run by its own path (so it finds pyvenv.cfg), not its real one
        candidates.append(str(venv))
    found = {q for c in candidates for q in (os.path.abspath(c), os.path.realpath(c))}
    found = {p for p in found if p not in ("/", "/tmp", "/usr") and not p.startswith("/usr/") and os.path.isdir(p)}
    return sorted(p for p in found if not any(p.startswith(q + "/") for q in found))  # nested: bound with q


def _bwrap_argv(bwrap: str, python: str, prog_fd: int, limits: SandboxLimits, uid: int,
                allow_site_packages: bool) -> list[str]:
    argv = [bwrap, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
            "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8", "--setenv", "HOME", "/tmp"]
    as_root = os.geteuid() == 0
    if as_root:  # no user namespace: setpriv below switches to a real unprivileged uid so NPROC binds
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID", "--cap-add", "CAP_SETPCAP"]
    else:
        argv += ["--unshare-user", "--disable-userns", "--uid", "65534", "--gid", "65534"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for d in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(d):
            argv += ["--symlink", os.readlink(d), d]
        elif os.path.isdir(d):
            argv += ["--ro-bind", d, d]
    for f in ("/etc/ld.so.cache", "/etc/localtime"):
        if os.path.exists(f):
            argv += ["--ro-bind", f, f]
    argv += ["--proc", "/proc", "--dev", "/dev",
             "--perms", "1777", "--size", str(limits.tmp_mb << 20), "--tmpfs", "/tmp"]
    made: set[str] = {"/tmp"}
    for prefix in _ro_prefixes(python):  # after the tmpfs, so a venv under /tmp stays visible
        for parent in reversed(Path(prefix).parents[:-1]):  # bwrap would create these 0700
            if str(parent) not in made:
                made.add(str(parent))
                argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", os.path.realpath(prefix), prefix]
    argv += ["--perms", "0444", "--ro-bind-data", str(prog_fd), "/prog.py", "--chdir", "/tmp", "--"]
    if as_root:
        argv += [_tool("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                 "--inh-caps=-all", "--bounding-set=-all", "--"]
    return argv + _limit_argv(limits) + _python_argv(python, allow_site_packages, "/prog.py")


def _others_can_run(path: str) -> bool:
    """Whether an unprivileged uid can traverse to and execute ``path`` (rlimit mode as root)."""
    p = Path(os.path.realpath(path))
    return all(os.stat(d).st_mode & 0o001 for d in p.parents) and bool(os.stat(p).st_mode & 0o001)


def _memfd(data: bytes, name: str) -> int:
    fd = os.memfd_create(name, 0)
    _write_all(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _collect(proc: subprocess.Popen, deadline: float, cap: int) -> tuple[bytes, bytes, bool, bool]:
    """Read stdout (at most ``cap`` bytes) and the stderr tail until exit, deadline or overflow."""
    out, err = bytearray(), bytearray()
    timed_out = exceeded = False
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ, out)
    sel.register(proc.stderr, selectors.EVENT_READ, err)
    try:
        while sel.get_map() and not (timed_out or exceeded):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            for key, _ in sel.select(min(remaining, 0.25)):
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                elif key.data is out:
                    out += chunk
                    exceeded = len(out) > cap
                else:
                    err += chunk
                    del err[:-8192]
        if not (timed_out or exceeded):
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.01))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        sel.close()
        if timed_out or exceeded or proc.poll() is None:
            _kill_group(proc)
        proc.wait()
        proc.stdout.close()
        proc.stderr.close()
    return bytes(out[:cap]), bytes(err), timed_out, exceeded


def run_in_sandbox(source: str, stdin: str = "", *, limits: SandboxLimits = SandboxLimits(),
                   sandbox: str | None = None, python: str | None = None,
                   allow_site_packages: bool = False) -> RunResult:
    """Run a Python program with ``stdin``; bounded in wall time, memory, processes and output."""
    mode = resolve_mode(sandbox)
    python = python or sys.executable
    prog_fd = _memfd(source.encode("utf-8", "replace"), "prog")
    in_fd = _memfd(stdin.encode("utf-8", "replace"), "stdin")
    slot = _SLOTS.get()
    workdir = None
    try:
        if mode == "bwrap":
            bwrap = shutil.which("bwrap")
            if bwrap is None:
                raise SandboxUnavailable(_MISSING_BWRAP)
            argv = _bwrap_argv(bwrap, python, prog_fd, limits, _slot_uid(slot), allow_site_packages)
            cwd = None
        else:
            import tempfile

            workdir = tempfile.TemporaryDirectory(prefix="r1-code-")
            os.chmod(workdir.name, 0o777)
            script = os.path.join(workdir.name, "prog.py")
            with open(script, "wb") as f:
                f.write(source.encode("utf-8", "replace"))
            os.chmod(script, 0o444)
            argv = _limit_argv(limits) + _python_argv(python, allow_site_packages, script)
            if os.geteuid() == 0 and _others_can_run(python):
                uid = _slot_uid(slot)
                argv = [_tool("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--no-new-privs",
                        "--inh-caps=-all", "--bounding-set=-all", "--", *argv]
            cwd = workdir.name
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": cwd or "/tmp"}
        start = time.monotonic()
        proc = subprocess.Popen(argv, stdin=in_fd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(prog_fd,), cwd=cwd, env=env, start_new_session=True)
        out, err, timed_out, exceeded = _collect(proc, start + limits.timeout, limits.max_output_bytes)
        return RunResult(
            returncode=None if (timed_out or exceeded) else proc.returncode,
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            timed_out=timed_out,
            output_exceeded=exceeded,
            seconds=time.monotonic() - start,
        )
    finally:
        _SLOTS.put(slot)
        os.close(prog_fd)
        os.close(in_fd)
        if workdir is not None:
            workdir.cleanup()


_MISSING_BWRAP = (
    "code_execution needs bubblewrap (`bwrap`) to sandbox model-written code, and it is not on PATH. "
    "Install it (`apt-get install -y bubblewrap`), or opt into the weaker rlimit-only mode (no filesystem "
    f"or network isolation) with sandbox='rlimit' or the environment variable {SANDBOX_ENV}=rlimit."
)


def resolve_mode(sandbox: str | None = None) -> str:
    mode = (sandbox or os.environ.get(SANDBOX_ENV) or "bwrap").strip().lower()
    if mode not in ("bwrap", "rlimit"):
        raise ValueError(f"sandbox must be 'bwrap' or 'rlimit', got {mode!r}")
    if mode == "bwrap" and shutil.which("bwrap") is None:
        raise SandboxUnavailable(_MISSING_BWRAP)
    return mode


def check_sandbox(sandbox: str | None = None, python: str | None = None) -> None:
    """Run ``print(6*7)`` once per mode and interpreter; raise naming what failed if it does not work."""
    mode = resolve_mode(sandbox)
    python = python or sys.executable
    key = (mode, python, os.environ.get("PATH"))
    with _CHECK_LOCK:
        if key in _CHECKED:
            return
        res = run_in_sandbox("print(6 * 7)", limits=SandboxLimits(timeout=30.0), sandbox=mode, python=python)
        if res.stdout.strip() != "42":
            raise SandboxUnavailable(_diagnose(mode, python, res))
        _CHECKED.add(key)


# What bwrap says when it may not create namespaces or mount (no user namespaces, a container without privileges).
_PRIVILEGE_ERRORS = ("namespace", "uid map", "gid map", "Operation not permitted", "Permission denied",
                     "No permissions")


def _diagnose(mode: str, python: str, res: RunResult) -> str:
    """Why the check program did not print 42: bwrap could not build the sandbox, the command inside could not
    start, or the interpreter started and failed. Each has its own fix."""
    err = res.stderr.strip()
    lines = err.splitlines()
    bwrap_err = next((line for line in lines if line.startswith("bwrap:")), None)
    or_rlimit = f", or set {SANDBOX_ENV}=rlimit to run without isolation" if mode == "bwrap" else ""
    if bwrap_err is not None and any(word in bwrap_err for word in _PRIVILEGE_ERRORS):
        return (f"bwrap cannot create its sandbox here ({bwrap_err}): it needs user namespaces, or root with "
                "CAP_SYS_ADMIN (in Docker: --privileged or a seccomp profile allowing unshare): enable them"
                f"{or_rlimit}.")
    if bwrap_err is not None and "execvp" not in bwrap_err:
        return f"bwrap could not build the sandbox ({bwrap_err}){or_rlimit}."
    start_err = bwrap_err or next((line for line in lines if "failed to execute" in line), None)
    if start_err is None:
        return (f"the interpreter {python} started in the {mode} sandbox but did not run `print(6 * 7)` "
                f"(exit {res.returncode}, timed out: {res.timed_out}): {err[-2000:] or 'no output'} -- it runs "
                f"with `-I -S -B` under SandboxLimits: fix the interpreter{or_rlimit}.")
    where = ""
    if mode == "bwrap":
        bound = ", ".join(["/usr", "/lib*", "/bin", *_ro_prefixes(python)])
        where = f"; inside the sandbox only {bound} are bound, read-only"
        if "Permission denied" in start_err:  # the bound folders keep their modes; root runs it as another uid
            where += ", and they must be readable by other users (`chmod o+rx` the interpreter's folders)"
    return (f"the {mode} sandbox started but the command inside failed to start ({start_err}): the interpreter "
            f"{python} cannot be executed there{where}. Point `python` at an interpreter whose files lie in those "
            f"folders (a venv's own bin/python, not a copy or a wrapper script){or_rlimit}.")


# ---------------------------------------------------------------- the reward


def _passes(program: str, case: TestCase, limits: SandboxLimits, mode: str,
            python: str | None, allow_site_packages: bool) -> tuple[bool, bool]:
    """(passed, timed_out) for one case."""
    if case.statement is not None:
        marker = secrets.token_hex(16)
        source = f"{program}\n\n{case.statement}\n\nprint({marker!r}, flush=True)\n"
        res = run_in_sandbox(source, limits=limits, sandbox=mode, python=python,
                             allow_site_packages=allow_site_packages)
        lines = res.stdout.rstrip("\n").rsplit("\n", 1)
        return res.returncode == 0 and lines[-1] == marker, res.timed_out
    res = run_in_sandbox(program, case.stdin, limits=limits, sandbox=mode, python=python,
                         allow_site_packages=allow_site_packages)
    return res.returncode == 0 and outputs_match(res.stdout, case.expected or ""), res.timed_out


def make_code_execution(*, limits: SandboxLimits = SandboxLimits(), sandbox: str | None = None,
                        max_workers: int | None = None, max_tests: int = 32, python: str | None = None,
                        allow_site_packages: bool = False) -> Callable[..., list[float | None]]:
    """A ``code_execution`` reward with its own limits; the registered one uses the defaults."""

    def code_execution(completions: list[Any], tests: list[Any] | None = None, **kwargs: Any) -> list[float | None]:
        if tests is None:
            tests = kwargs.get("input_output")
        if tests is None:
            return [None] * len(completions)
        mode = resolve_mode(sandbox)
        check_sandbox(mode, python)
        programs, cases = [], []
        for completion, raw in zip(completions, tests):
            try:
                programs.append(extract_program(completion_text(completion)))
                cases.append((parse_tests(raw) or [])[:max_tests] or None)
            except Exception:  # malformed row: score 0, never crash the trainer
                count_reward_event(NAME, "errors")
                programs.append(None)
                cases.append([])
        hung = [False] * len(completions)

        def job(i: int, case: TestCase) -> bool:
            if hung[i]:  # this program already timed out once
                return False
            try:
                ok, timed_out = _passes(programs[i], case, limits, mode, python, allow_site_packages)
            except SandboxUnavailable:
                raise
            except Exception:
                count_reward_event(NAME, "errors")
                return False
            if timed_out:
                hung[i] = True
                count_reward_event(NAME, "timeouts")
            return ok

        # A program's first case runs before its others, so a hanging program costs one timeout.
        passed = [0] * len(completions)
        workers = max_workers or min(4, os.cpu_count() or 1)
        with ThreadPoolExecutor(max_workers=workers) as pool:
            first = {pool.submit(job, i, cs[0]): i for i, cs in enumerate(cases) if cs and programs[i] is not None}
            rest: list[tuple[int, Future[bool]]] = []
            for fut in as_completed(first):
                i = first[fut]
                passed[i] += fut.result()
                rest += [(i, pool.submit(job, i, c)) for c in (cases[i] or [])[1:] if not hung[i]]
            for i, fut in rest:
                passed[i] += fut.result()
        return [
            None if cs is None else (0.0 if not cs or programs[i] is None else passed[i] / len(cs))
            for i, cs in enumerate(cases)
        ]

    return code_execution


code_execution = make_code_execution()
