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

from tests.flows.test_interrupt import REPO, _alive, _as_in_a_terminal, _config, _env, _r1

RUN = "server-killed"


@pytest.mark.slow
def test_server_killed_mid_grpo_stops_in_seconds_and_resumes(tmp_path):
    config, store, env = _config(tmp_path), tmp_path / "store", _env(tmp_path)
    log = tmp_path / "run.log"
    command = _r1("run", "-c", str(config), "--run", RUN, "--store", str(store))
    with open(log, "w") as out:
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True, preexec_fn=_as_in_a_terminal)
    checkpoints = store / RUN / "grpo_train" / "_checkpoints"
    deadline = time.monotonic() + 600
    while not list(checkpoints.glob("*/checkpoint-*/_COMPLETE")):
        assert proc.poll() is None, f"r1 run ended before GRPO checkpointed:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "no GRPO checkpoint within 600 s"
        time.sleep(0.1)
    family = psutil.Process(proc.pid).children(recursive=True)
    servers = [p for p in family if "uvicorn" in " ".join(p.cmdline())]
    assert len(servers) == 1 and any("tasks._worker" in " ".join(p.cmdline()) for p in family)
    port = servers[0].cmdline()[servers[0].cmdline().index("--port") + 1]
    before = len(log.read_text().splitlines())

    servers[0].kill()
    killed = time.monotonic()
    try:
        returncode = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"r1 run still running 60 s after its Prefect server died:\n{log.read_text()[-3000:]}")
    took = time.monotonic() - killed
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
    assert _alive(family) == []  # the trainer went down with the run

    status = subprocess.run(_r1("status", RUN, "--json", "--store", str(store)), cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=120)
    stages = json.loads(status.stdout)["stages"]
    assert stages["prepare_data"]["state"] == stages["cold_start_sft"]["state"] == "completed", stages

    # The same run resumes (the lease was released): GRPO from its last checkpoint, not from step 0.
    rerun = subprocess.run(_r1("stage", "grpo_train", "--run", RUN, "-c", str(config), "--store", str(store)),
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    manifest = json.loads(sorted((store / RUN / "grpo_train").glob("*/manifest.json"))[-1].read_text())
    assert 2 <= manifest["training"]["resumed_from_step"] < 40
