"""The temporary Prefect server dies while GRPO trains (OOM killer, a stray ``kill -9``).

``r1 run`` must notice and stop within seconds: one ``error:`` line naming the server and how to resume, exit
code 1, no traceback flood, no process left behind; then the same run resumes from its last GRPO checkpoint.
Before the watch (``flows/prefect_watch.py``) it went on blind, each Prefect call retrying for ~60 s.
"""

from __future__ import annotations

import json
import subprocess
import time

import psutil
import pytest

from tests.flows.test_interrupt import GRPO_STEPS, REPO, _alive, _config, _env, _r1, _run_until_grpo_checkpoint, _wait_exit

RUN = "server-killed"


@pytest.mark.slow
def test_server_killed_mid_grpo_stops_in_seconds_and_resumes(tmp_path):
    config, store, env, log = _config(tmp_path), tmp_path / "store", _env(tmp_path), tmp_path / "run.log"
    proc = _run_until_grpo_checkpoint(RUN, config, store, env, log)
    family = {" ".join(p.cmdline()): p for p in psutil.Process(proc.pid).children(recursive=True)}
    servers = [p for cmd, p in family.items() if "uvicorn" in cmd]  # r1's own temporary server
    assert len(servers) == 1 and any("tasks.runner.worker" in cmd for cmd in family), list(family)
    port = servers[0].cmdline()[servers[0].cmdline().index("--port") + 1]
    before = len(log.read_text().splitlines())

    servers[0].kill()
    returncode, took = _wait_exit(proc, log, time.monotonic(), "its Prefect server died")
    print(f"r1 run exited {took:.1f} s after its server was killed")
    after = log.read_text().splitlines()[before:]
    errors = [line for line in after if line.startswith("error:")]
    assert returncode == 1, "\n".join(after[-40:])
    assert took < 30, f"exit took {took:.1f} s"
    assert len(errors) == 1, "\n".join(after[-40:])
    assert f"Prefect server at http://127.0.0.1:{port}/api" in errors[0] and "rerun the same command" in errors[0]
    assert len(after) < 20, "\n".join(after[-40:])
    assert "Traceback" not in "\n".join(after) and "Error logging to API" not in "\n".join(after)
    time.sleep(0.5)
    assert _alive(list(family.values())) == []  # the trainer went down with the run

    status = subprocess.run(_r1("status", RUN, "--json", "--store", str(store)), cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    stages = json.loads(status.stdout)["stages"]
    assert stages["prepare_data"]["state"] == stages["cold_start_sft"]["state"] == "completed", stages

    # The same run resumes (the lease was released): GRPO from its last checkpoint, not from step 0.
    rerun = subprocess.run(_r1("stage", "grpo_train", "--run", RUN, "-c", str(config), "--store", str(store)),
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    manifest = json.loads(sorted((store / RUN / "grpo_train").glob("*/manifest.json"))[-1].read_text())
    assert 2 <= manifest["training"]["resumed_from_step"] < GRPO_STEPS


@pytest.mark.slow
def test_server_stopped_mid_grpo_stops_the_run_within_30_s(tmp_path):
    """SIGSTOP: the server process lives, accepts connections and never answers. It took 140 s to stop the run
    (each Prefect call waiting its 60 s request timeout), silent meanwhile; the watch now kills a stopped server."""
    config, store, env, log = _config(tmp_path), tmp_path / "store", _env(tmp_path), tmp_path / "run.log"
    proc = _run_until_grpo_checkpoint("server-stopped", config, store, env, log)
    family = {" ".join(p.cmdline()): p for p in psutil.Process(proc.pid).children(recursive=True)}
    server = next(p for cmd, p in family.items() if "uvicorn" in cmd)
    port = server.cmdline()[server.cmdline().index("--port") + 1]
    before = len(log.read_text().splitlines())

    server.suspend()  # SIGSTOP
    try:
        returncode, took = _wait_exit(proc, log, time.monotonic(), "its Prefect server was stopped")
    finally:
        if server.is_running():
            server.kill()
    print(f"r1 run exited {took:.1f} s after its server was stopped")
    after = log.read_text().splitlines()[before:]
    errors = [line for line in after if line.startswith("error:")]
    assert returncode == 1 and took < 30, (took, "\n".join(after[-40:]))
    assert len(errors) == 1 and len(after) < 20, "\n".join(after[-40:])
    assert errors[0].startswith(f"error: the temporary Prefect server at http://127.0.0.1:{port}/api stopped: its "
                                f"process (pid {server.pid}) is stopped (state T: SIGSTOP or a debugger)"), errors[0]
    assert "so it was killed" in errors[0] and "rerun the same command to resume" in errors[0]
    assert "Traceback" not in "\n".join(after)
    time.sleep(0.5)
    assert _alive(list(family.values())) == []
