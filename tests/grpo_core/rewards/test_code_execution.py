"""code_execution: scoring, test-case formats, and one test per sandbox attack (each contained, scored 0,
and the machine still runs a normal program quickly afterwards)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from grpo_core.rewards import pop_reward_stats
from grpo_core.rewards.code import (
    _ro_prefixes,
    SandboxLimits,
    SandboxUnavailable,
    check_sandbox,
    code_execution,
    extract_program,
    make_code_execution,
    parse_tests,
    run_in_sandbox,
)

pytestmark = pytest.mark.sandbox
needs_bwrap = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="bubblewrap not installed (apt-get install -y bubblewrap)"
)

LIMITS = SandboxLimits(timeout=2.0)
ADD = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
ADD_TESTS = [{"input": "1 2\n", "output": "3\n"}, {"input": "2 2\n", "output": "4"}]
EXPECT_PWNED = [{"input": "", "output": "pwned"}]  # scored 1 only if the attack worked


def fenced(code: str) -> str:
    return f"Here is my solution.\n```python\n{code}\n```\n"


def assert_usable() -> None:
    """A normal program still runs and passes after an attack (no case reached its timeout), in seconds."""
    start = time.monotonic()
    assert code_execution([ADD], tests=[ADD_TESTS]) == [1.0]
    assert time.monotonic() - start < 10  # ~0.05 s on a quiet machine; a clogged sandbox would hang


# ---------------------------------------------------------------- no sandbox needed


def test_extract_program_takes_last_python_block_after_think() -> None:
    text = "<think>```python\nprint(0)\n```</think>```python\nprint(1)\n```\n```python\nprint(2)\n```\n```cpp\nx\n```"
    assert extract_program(text) == "print(2)\n"
    assert extract_program("```\nprint(3)\n```") == "print(3)\n"
    assert extract_program("```python\nprint(4)\n```\n```python\nunclosed") == "print(4)\n"
    assert extract_program("```cpp\nint main(){}\n```") is None
    assert extract_program("no code at all") is None


def test_parse_tests_accepts_lists_apps_mbpp_and_json() -> None:
    assert parse_tests(None) is None and parse_tests("") is None and parse_tests([]) is None
    io = parse_tests('[{"input": "1", "output": "2"}]')
    assert io is not None and (io[0].stdin, io[0].expected) == ("1", "2")
    apps = parse_tests({"inputs": ["1\n", ["2", "3"]], "outputs": ["x", "y"]})
    assert apps is not None and [c.stdin for c in apps] == ["1\n", "2\n3"]
    assert parse_tests({"inputs": [[1]], "outputs": [2], "fn_name": "f"}) is None  # call-based: unsupported
    mbpp = parse_tests('{"setup": "import math", "asserts": ["assert f(1) == 1"]}')
    assert mbpp is not None and mbpp[0].statement == "import math\nassert f(1) == 1"
    asserts = parse_tests(["assert f(1) == 1", "assert f(2) == 2"])
    assert asserts is not None and len(asserts) == 2
    assert parse_tests("assert f(1) == 1")[0].statement == "assert f(1) == 1"  # type: ignore[index]


def test_missing_bwrap_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # a PATH without bwrap
    monkeypatch.delenv("R1_CODE_SANDBOX", raising=False)
    with pytest.raises(SandboxUnavailable, match=r"apt-get install -y bubblewrap.*R1_CODE_SANDBOX=rlimit"):
        code_execution([ADD], tests=[ADD_TESTS])


def test_rlimit_only_mode_runs_and_contains(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"  # PATH without bwrap, with util-linux's prlimit/setpriv
    bin_dir.mkdir()
    for tool in ("prlimit", "setpriv"):
        os.symlink(shutil.which(tool), bin_dir / tool)  # type: ignore[arg-type]
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.setenv("R1_CODE_SANDBOX", "rlimit")
    pop_reward_stats()
    half = ADD.replace("a + b", "a * b")
    start = time.monotonic()
    loop = fenced("while True:\n    pass")
    big = fenced("x = bytearray(4 << 30)\nprint('pwned')")
    scores = code_execution([ADD, half, loop, big], tests=[ADD_TESTS, ADD_TESTS, EXPECT_PWNED, EXPECT_PWNED])
    assert scores == [1.0, 0.5, 0.0, 0.0]
    assert time.monotonic() - start < LIMITS.timeout + 15  # the loop killed at its timeout
    assert pop_reward_stats().get("rewards/code_execution/timeouts") == 1.0
    res = run_in_sandbox("x = bytearray(4 << 30)", sandbox="rlimit", limits=LIMITS)
    assert res.returncode != 0 and "MemoryError" in res.stderr


# ---------------------------------------------------------------- scoring in the bwrap sandbox


@needs_bwrap
def test_correct_half_and_no_code() -> None:
    half = ADD.replace("a + b", "a * b")  # right on 2 2, wrong on 1 2
    scores = code_execution([ADD, half, "The answer is 3.", ADD], tests=[ADD_TESTS, ADD_TESTS, ADD_TESTS, None])
    assert scores == [1.0, 0.5, 0.0, None]


@needs_bwrap
def test_json_column_and_assert_style() -> None:
    prog = fenced("def add(a, b):\n    return a + b")
    tests = '["assert add(1, 2) == 3", "assert add(2, 2) == 5"]'  # second is wrong on purpose
    exits_early = fenced("import sys\nsys.exit(0)")  # skips the asserts: must not pass
    os_exit = fenced("import os\nos._exit(0)")
    assert code_execution([prog, exits_early, os_exit], tests=[tests] * 3) == [0.5, 0.0, 0.0]
    assert code_execution([ADD], input_output=[{"inputs": ["1 2"], "outputs": ["3"]}]) == [1.0]


@pytest.fixture(scope="module")
def tmp_venv() -> Path:
    """A venv under /tmp (as the README's install into a fresh venv makes), sharing this interpreter's packages."""
    root = Path(tempfile.mkdtemp(prefix="r1-venv-", dir="/tmp"))  # 0700: inside, only the venv is bound
    try:
        subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(root / "venv")],
                       check=True, capture_output=True, timeout=120)
        yield root / "venv" / "bin" / "python3"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@needs_bwrap
def test_interpreter_in_a_venv_under_tmp_runs(tmp_venv: Path) -> None:
    # the sandbox mounts its own tmpfs on /tmp: the venv must be bound after it, or the interpreter vanishes
    fn = make_code_execution(limits=LIMITS, python=str(tmp_venv))
    assert fn([ADD], tests=[ADD_TESTS]) == [1.0]
    # and the same from a process run by that interpreter (sys.prefix is the venv)
    repo = Path(__file__).resolve().parents[3]
    code = ("from grpo_core.rewards.code import code_execution, run_in_sandbox\n"
            f"print(code_execution([{ADD!r}], tests=[{ADD_TESTS!r}]))\n"
            "print(run_in_sandbox('import os; print(sorted(os.listdir(\"/tmp\")))').stdout)\n")
    env = {**os.environ, "PYTHONPATH": str(repo)}
    out = subprocess.run([str(tmp_venv), "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert lines[0] == "[1.0]"
    assert lines[1] == repr([tmp_venv.parents[2].name]), lines  # the sandbox /tmp: the venv's mount point only


@needs_bwrap
def test_sandbox_errors_name_the_real_cause(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    missing = tmp_path / "gone" / "bin" / "python3"  # the command inside cannot start: not a namespace problem
    with pytest.raises(SandboxUnavailable, match="command inside failed to start") as err:
        check_sandbox("bwrap", str(missing))
    assert str(missing) in str(err.value) and "namespaces" not in str(err.value)

    bin_dir = tmp_path / "bin"  # a bwrap that cannot create its namespaces (a locked-down container)
    bin_dir.mkdir()
    for tool in ("prlimit", "setpriv"):
        os.symlink(shutil.which(tool), bin_dir / tool)  # type: ignore[arg-type]
    fake = bin_dir / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: Creating new namespace failed: Operation not permitted' >&2\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    with pytest.raises(SandboxUnavailable, match="bwrap cannot create its sandbox.*user namespaces") as err:
        check_sandbox("bwrap")
    assert "Operation not permitted" in str(err.value) and "failed to start" not in str(err.value)


# ---------------------------------------------------------------- attacks


@needs_bwrap
def test_program_runs_unprivileged() -> None:
    res = run_in_sandbox("print(open('/proc/self/status').read())", limits=LIMITS)
    status = dict(line.split(":", 1) for line in res.stdout.splitlines() if ":" in line)
    assert status["NoNewPrivs"].strip() == "1"  # setuid binaries (su, mount) cannot raise privileges
    assert int(status["CapEff"], 16) == 0 and int(status["CapPrm"], 16) == 0
    if os.geteuid() == 0:  # the program runs under a real unprivileged uid, so RLIMIT_NPROC applies
        assert int(status["Uid"].split()[0]) >= 3_000_000 and int(status["CapBnd"], 16) == 0


@needs_bwrap
def test_network_is_unreachable() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    port = listener.getsockname()[1]
    # 1.1.1.1:53 is never reached: the sandbox's network namespace has only a loopback, so connect fails at once
    code = (
        "import socket\n"
        f"for addr in [('127.0.0.1', {port}), ('1.1.1.1', 53)]:\n"
        "    try:\n"
        "        socket.create_connection(addr, timeout=1).close()\n"
        "        print('pwned')\n"
        "    except OSError as e:\n"
        "        print(type(e).__name__, e.errno)\n"
    )
    try:
        assert code_execution([fenced(code)], tests=[EXPECT_PWNED]) == [0.0]
        res = run_in_sandbox(code, limits=LIMITS)
        lines = res.stdout.splitlines()
        assert lines[0].startswith("ConnectionRefusedError") and lines[1].startswith("OSError 101"), res
        assert res.seconds < 1.0  # both failed immediately, no timeout involved
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever reached the host's listener
    finally:
        listener.close()
    assert_usable()


@needs_bwrap
def test_cannot_write_outside_sandbox_tmp(tmp_path: Path) -> None:
    name = f"r1_sandbox_pwned_{os.getpid()}"
    targets = [Path(__file__).resolve().parents[3] / name, Path("/root") / name, tmp_path / name, Path("/tmp") / name]
    code = (
        "import sys\n"
        f"for p in {[str(t) for t in targets]!r}:\n"
        "    try:\n"
        "        open(p, 'w').write('x')\n"
        "        print('wrote', p)\n"
        "    except OSError as e:\n"
        "        print(type(e).__name__, p)\n"
    )
    assert code_execution([fenced(code)], tests=[EXPECT_PWNED]) == [0.0]
    res = run_in_sandbox(code, limits=LIMITS)
    assert res.returncode == 0
    assert "wrote /tmp/" in res.stdout  # the sandbox's own tmpfs is writable ...
    for t in targets:
        assert not t.exists(), f"{t} was written from inside the sandbox"  # ... and leaves nothing behind
    assert_usable()


@needs_bwrap
def test_cannot_read_files_outside(tmp_path: Path) -> None:
    secret = f"secret-{os.getpid()}-{time.time_ns()}"
    repo_parent = Path(__file__).resolve().parents[4]  # e.g. /work
    dirs = [tmp_path, Path(tempfile.mkdtemp(dir="/root")), Path(tempfile.mkdtemp(dir=repo_parent))]
    files = []
    try:
        for d in dirs:
            (d / "secret.txt").write_text(secret)
            files.append(str(d / "secret.txt"))
        code = (
            "import os\n"
            f"for p in {files!r}:\n"
            "    try:\n"
            "        print(open(p).read())\n"
            "    except OSError as e:\n"
            "        print(type(e).__name__)\n"
            "print(sorted(os.listdir('/')))\n"
        )
        assert code_execution([fenced(code)], tests=[[{"input": "", "output": secret}]]) == [0.0]
        res = run_in_sandbox(code, limits=LIMITS)
        assert secret not in res.stdout
        assert res.stdout.count("FileNotFoundError") == len(files), res
        listing = res.stdout.splitlines()[-1]
        # only the interpreter's own folders are bound (a venv under /work brings an empty /work/<path> skeleton)
        bound = {Path(p).parts[1] for p in _ro_prefixes(sys.executable)}
        for name in ("work", "home", "root"):
            assert (f"'{name}'" in listing) <= (name in bound), (name, listing)
    finally:
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)
    assert_usable()


def _sandbox_pids() -> list[int]:
    """Processes owned by the unprivileged uids the sandbox runs programs under (root) or inside bwrap."""
    pids = []
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            uid = int(next(l for l in status.read_text().splitlines() if l.startswith("Uid:")).split()[1])
        except (OSError, StopIteration, ValueError):
            continue
        if uid >= 3_000_000:
            pids.append(int(status.parent.name))
    return pids


@needs_bwrap
def test_fork_bomb_is_bounded() -> None:
    # First a bounded probe (200 short-lived children at most): the process limit must stop it early,
    # otherwise the real bomb below is not run.
    probe = (
        "import os, time\n"
        "n = 0\n"
        "for _ in range(200):\n"
        "    try:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(0.5)\n"
        "            os._exit(0)\n"
        "        n += 1\n"
        "    except OSError:\n"
        "        break\n"
        "print(n)\n"
    )
    res = run_in_sandbox(probe, limits=LIMITS)
    assert res.returncode == 0 and int(res.stdout) < LIMITS.max_processes, f"process limit not enforced: {res}"

    bomb = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    pop_reward_stats()
    start = time.monotonic()
    assert code_execution([fenced(bomb)], tests=[EXPECT_PWNED]) == [0.0]
    assert time.monotonic() - start < LIMITS.timeout + 10.0  # killed at the timeout, not left forking
    assert pop_reward_stats().get("rewards/code_execution/timeouts") == 1.0
    deadline = time.monotonic() + 2.0
    while _sandbox_pids() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _sandbox_pids() == []  # the pid namespace took every forked process with it
    assert_usable()


@needs_bwrap
def test_4gb_allocation_fails_fast() -> None:
    code = "x = bytearray(4 << 30)\nprint('pwned')"
    assert code_execution([fenced(code)], tests=[EXPECT_PWNED]) == [0.0]
    res = run_in_sandbox(code, limits=LIMITS)
    assert res.returncode != 0 and "MemoryError" in res.stderr and not res.timed_out
    assert_usable()


@needs_bwrap
def test_infinite_loop_is_killed_at_the_timeout() -> None:
    pop_reward_stats()
    start = time.monotonic()
    loop = fenced("while True:\n    pass")
    # three cases: after the first timeout the rest are skipped, so one timeout in all
    assert code_execution([loop], tests=[EXPECT_PWNED * 3]) == [0.0]
    elapsed = time.monotonic() - start
    assert LIMITS.timeout <= elapsed < LIMITS.timeout + 10  # killed at its timeout (room for a slow machine)
    assert pop_reward_stats().get("rewards/code_execution/timeouts") == 1.0
    assert_usable()


@needs_bwrap
def test_huge_print_is_cut_off() -> None:
    code = "import sys\nchunk = 'x' * (1 << 20)\nfor _ in range(1024):\n    sys.stdout.write(chunk)\n"  # 1 GB
    start = time.monotonic()
    assert code_execution([fenced(code)], tests=[[{"input": "", "output": "x" * 100}]]) == [0.0]
    res = run_in_sandbox(code, limits=LIMITS)
    assert res.output_exceeded and len(res.stdout) <= LIMITS.max_output_bytes
    assert time.monotonic() - start < 2 * LIMITS.timeout
    assert_usable()


@needs_bwrap
def test_filling_the_sandbox_tmp_is_bounded() -> None:
    code = (
        "chunk = b'x' * (1 << 20)\n"
        "try:\n"
        "    for i in range(1024):\n"
        "        with open(f'/tmp/f{i % 100}', 'wb') as f:\n"
        "            for _ in range(8):  # 8 MB files: under RLIMIT_FSIZE, so the tmpfs size is what stops it\n"
        "                f.write(chunk)\n"
        "    print('pwned')\n"
        "except OSError as e:\n"
        "    print(type(e).__name__, e.errno)\n"
    )
    res = run_in_sandbox(code, limits=LIMITS)
    assert "pwned" not in res.stdout and "28" in res.stdout, res  # ENOSPC: the tmpfs size cap
    assert_usable()


@needs_bwrap
def test_parallel_batch_and_untrusted_output_never_raises() -> None:
    fn = make_code_execution(limits=LIMITS, max_workers=2)
    weird = ["```python\nprint('\\udcff' * 10)\n```", "```python\nraise SystemExit('boom')\n```",
             "```python\nimport os; os.kill(os.getpid(), 9)\n```", "```python\n\x00\n```"]
    completions = [[{"role": "assistant", "content": c}] for c in [ADD, *weird]]
    assert fn(completions, tests=[ADD_TESTS] * 5) == [1.0, 0.0, 0.0, 0.0, 0.0]
