"""Ctrl-C in a terminal: SIGINT to the whole process group of ``r1 run`` while a stage trains.

The command must exit 130 within seconds, leave no process behind (Prefect server, worker, trainer), record
its flow runs as Cancelled, and a rerun must resume the stage from its last stored checkpoint.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
RUN = "interrupted"
GRPO_STEPS = 16  # long enough to be interrupted after its first checkpoint (step 2), short to resume


def _config(tmp_path: Path) -> Path:
    cfg = yaml.safe_load((REPO / "configs" / "ci-tiny.yaml").read_text())
    cfg["grpo_train"].update(max_steps=GRPO_STEPS, save_steps=2)
    cfg["run"].update(isolation="subprocess")  # the trainer in its own process group, as `r1 run` runs it
    path = tmp_path / "long-grpo.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _env(tmp_path: Path) -> dict[str, str]:
    # No PREFECT_API_URL: the command starts its own temporary server, as on a fresh machine.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PYTHONPATH=str(REPO))
    return env


def _r1(*args: str) -> list[str]:
    return [sys.executable, "-c", "from flows.cli import main; main()", *args]


def _as_in_a_terminal() -> None:
    """SIGINT handled as in a terminal: a command started in the background by a non-interactive shell (CI run
    as ``bash .ci/run &``) inherits SIGINT ignored, and Python then never turns it into KeyboardInterrupt."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _alive(procs: list[psutil.Process]) -> list[str]:
    left = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                left.append(" ".join(p.cmdline())[:120])
        except psutil.NoSuchProcess:
            pass
    return left


def _run_until_grpo_checkpoint(run: str, config: Path, store: Path, env: dict[str, str], log: Path,
                               ) -> subprocess.Popen[bytes]:
    """Start ``r1 run`` as from a terminal, output to ``log``; return once GRPO has stored a checkpoint."""
    with open(log, "w") as out:
        proc = subprocess.Popen(_r1("run", "-c", str(config), "--run", run, "--store", str(store)), cwd=REPO,
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=_as_in_a_terminal)
    checkpoints = store / run / "grpo_train" / "_checkpoints"
    deadline = time.monotonic() + 600
    while not list(checkpoints.glob("*/checkpoint-*/_COMPLETE")):
        assert proc.poll() is None, f"r1 run ended before GRPO checkpointed:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "no GRPO checkpoint within 600 s"
        time.sleep(0.1)
    return proc


def _wait_exit(proc: subprocess.Popen[bytes], log: Path, since: float, after: str) -> tuple[int, float]:
    """``r1 run``'s exit code and the seconds from ``since``; fail if it runs 60 s on ``after``."""
    try:
        returncode = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail(f"r1 run still running 60 s after {after}:\n{log.read_text()[-3000:]}")
    return returncode, time.monotonic() - since


@pytest.mark.extended
@pytest.mark.slow
def test_ctrl_c_stops_in_seconds_cancels_and_resumes(tmp_path):
    config, store, env = _config(tmp_path), tmp_path / "store", _env(tmp_path)
    log = tmp_path / "run.log"
    proc = _run_until_grpo_checkpoint(RUN, config, store, env, log)
    family = psutil.Process(proc.pid).children(recursive=True)
    assert any("tasks.runner.worker" in " ".join(p.cmdline()) for p in family)  # interrupted while training
    assert any("uvicorn" in " ".join(p.cmdline()) for p in family)  # and its own Prefect server is up

    os.killpg(proc.pid, signal.SIGINT)  # what a terminal sends on Ctrl-C
    sent = time.monotonic()
    returncode, took = _wait_exit(proc, log, sent, "SIGINT")
    print(f"r1 run exited {took:.1f} s after SIGINT")
    output = log.read_text()
    assert returncode == 130, output[-3000:]
    assert took < 10, f"exit took {took:.1f} s"
    assert "flow run(s) marked Cancelled" in output
    assert "ConnectError" not in output and "Traceback" not in output, output[-3000:]
    time.sleep(0.5)
    assert _alive(family) == []

    db = sqlite3.connect(tmp_path / "prefect-home" / "prefect.db")  # the temporary server's database
    states = dict(db.execute("SELECT name, state_type FROM flow_run").fetchall())
    db.close()
    assert states[RUN] == "CANCELLED" and states[f"{RUN}-grpo-train"] == "CANCELLED", states
    assert states[f"{RUN}-cold-start-sft"] == "COMPLETED"

    rerun = subprocess.run(_r1("stage", "grpo_train", "--run", RUN, "-c", str(config), "--store", str(store)),
                           cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert rerun.returncode == 0, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    manifests = sorted((store / RUN / "grpo_train").glob("*/manifest.json"))
    manifest = json.loads(manifests[-1].read_text())
    assert 2 <= manifest["training"]["resumed_from_step"] < GRPO_STEPS
