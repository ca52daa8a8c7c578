"""No command waits without bound: an S3 endpoint or a Prefect server that accepts connections and never
answers ends ``r1 status`` / ``r1 run`` / ``r1 stage`` / ``r1 deploy`` in seconds with one error line naming it.

Each command runs as its own process (``python -m flows.cli``) with a wall-clock limit, so a regression
fails the test instead of hanging the suite, and the process reads the environment as a user's shell sets it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tasks.storage.store import Store

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 150  # seconds before the test gives up on the command; each command below needs far less
BOUND = 100  # what a command may take: imports (~5-15 s on 2 quiet cores, several times that on a busy CI
# machine) + a 2 s timeout; without the timeouts each command waits for minutes or for ever


def _r1(tmp_path: Path, args: list[str], **env: str) -> tuple[str, float]:
    """Run ``r1 args`` with ``env`` (and 2 s timeouts); its one ``error:`` line and the seconds it took."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "PREFECT_API_", "R1_"))}
    base.update(PREFECT_HOME=str(tmp_path / "prefect-home"), AWS_ACCESS_KEY_ID="testing",
                AWS_SECRET_ACCESS_KEY="supersecret-value", R1_S3_CONNECT_TIMEOUT="2", R1_S3_READ_TIMEOUT="2",
                R1_PREFECT_PROBE_TIMEOUT="2", **env)
    base["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)  # this checkout
    start = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-m", "flows.cli", *args], cwd=tmp_path, env=base,
                              capture_output=True, text=True, timeout=LIMIT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"r1 {' '.join(args)} still running after {LIMIT} s")
    took = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stdout + proc.stderr
    return lines[0], took


def test_status_with_an_s3_endpoint_that_never_answers(tmp_path, black_hole):
    url, accepted = black_hole
    line, took = _r1(tmp_path, ["status", "x", "--store", "s3://bucket/p"], AWS_ENDPOINT_URL_S3=url)
    assert line == (f"error: cannot reach S3 endpoint {url} for s3://bucket/p while opening the store: no answer "
                    "within 2 s (R1_S3_READ_TIMEOUT, the limit on one store operation); check AWS_ENDPOINT_URL_S3 and "
                    "the network")
    assert took < BOUND and accepted


def _silent_prefect(url: str) -> str:
    return (f"no answer from the Prefect API at {url}/api (PREFECT_API_URL) within 2 s (R1_PREFECT_PROBE_TIMEOUT); "
            "check that the server is up and the URL is right")


def test_deploy_with_a_prefect_server_that_never_answers(tmp_path, black_hole):
    url, accepted = black_hole
    line, took = _r1(tmp_path, ["deploy"], PREFECT_API_URL=f"{url}/api")
    assert line == f"error: {_silent_prefect(url)}"
    assert took < BOUND and accepted


TINY = "model: {tiny: {hidden_size: 16, num_layers: 1, num_heads: 2}}\n"


@pytest.mark.parametrize("command", [["run", "--run", "x"], ["stage", "prepare_data", "--run", "x"]])
def test_run_and_stage_with_a_prefect_server_that_never_answers(tmp_path, black_hole, command):
    """Refused before the run's lease and before any flow: the store holds nothing afterwards."""
    url, accepted = black_hole
    (tmp_path / "tiny.yaml").write_text(TINY)
    store = tmp_path / "store"
    line, took = _r1(tmp_path, [*command, "-c", "tiny.yaml", "--store", str(store)], PREFECT_API_URL=f"{url}/api")
    assert line == f"error: {_silent_prefect(url)}, or unset PREFECT_API_URL to run without a server"
    assert took < BOUND and accepted
    assert Store(store).runs() == [] and not any(p.is_file() for p in store.rglob("*"))


def test_refused_connection_to_prefect_is_one_line_too(tmp_path):
    line, _ = _r1(tmp_path, ["deploy"], PREFECT_API_URL="http://127.0.0.1:9/api")
    assert line.startswith("error: cannot connect to the Prefect API at http://127.0.0.1:9/api (PREFECT_API_URL) (")
    assert line.endswith("); start it (prefect server start) or fix the URL")


def test_a_server_that_answers_passes_the_probe():
    from prefect.settings import PREFECT_API_URL

    from flows.prefect_api import check_prefect_api

    assert PREFECT_API_URL.value()  # the session's test server (tests/flows/conftest.py)
    check_prefect_api()
