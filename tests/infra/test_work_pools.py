"""Deployments on work pools, for real: a Prefect server on 127.0.0.1, a CPU and a "GPU" process pool with
one worker each, the deployments of infra/prefect.yaml registered by ``r1 deploy``'s code, and the whole
pipeline triggered with ``dispatch="deployments"`` on configs/ci-tiny.yaml (shortened further below).

    python -m pytest tests/infra/test_work_pools.py -m work_pools -q

The two tests share the server and run in order: the second reruns one stage of the first's run, kills it
and retries it (the Crashed-run recovery path).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from flows.deploy import ROOT, ensure_pool, pool_template
from tasks.config.pipeline import load_config
from tasks.config.stages import all_stages, stage_names

pytestmark = [pytest.mark.work_pools, pytest.mark.slow, pytest.mark.extended]

RUN = "wp-1"
STAGES = stage_names()
POOL_OF = {s.name: s.pool for s in all_stages()}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def tiny_config() -> dict[str, Any]:
    """configs/ci-tiny.yaml, evaluated greedily on 4 rows, with rejection sampling keeping every sample: this
    test is about dispatch, and a 4-step model rarely answers right, which would leave sft_consolidate no data."""
    cfg = load_config(ROOT / "configs" / "ci-tiny.yaml").model_dump(mode="json")
    cfg["evaluate"].update(max_rows=4)
    cfg["evaluate"]["sampling"]["num_generations"] = 0
    cfg["rejection_sample"].update(reward_threshold=0.0, drop_truncated=False)
    return cfg


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Server + pools + deployments + one worker per pool; yields paths and names the tests read."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    tmp = tmp_path_factory.mktemp("work-pools")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        "PREFECT_HOME": str(tmp / "prefect-home"),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_UI_ENABLED": "false",
        "PREFECT_WORKER_QUERY_SECONDS": "1",  # workers poll every second instead of 15
        "R1_DISPATCH_POLL_SECONDS": "1",
        "R1_STORE": str(tmp / "store"),
        "R1_WORKDIR": str(tmp / "work"),
        "OMP_NUM_THREADS": "1",
        "HF_HUB_OFFLINE": "1",
    }
    procs: list[subprocess.Popen[bytes]] = []
    logs: dict[str, Path] = {}

    def start(name: str, *args: str, extra_env: dict[str, str] | None = None) -> None:
        logs[name] = tmp / f"{name}.log"
        child_env = {**os.environ, **env, **(extra_env or {})}
        procs.append(subprocess.Popen([sys.executable, "-m", "prefect", *args], cwd=ROOT, env=child_env,
                                      stdout=logs[name].open("wb"), stderr=subprocess.STDOUT))

    mp = pytest.MonkeyPatch()
    try:
        for k, v in env.items():
            mp.setenv(k, v)
        start("server", "server", "start", "--host", "127.0.0.1", "--port", str(port),
              extra_env={"PREFECT_API_URL": ""})
        wait_for(lambda: healthy(api) or procs[0].poll() is not None, 180, "the Prefect server")
        assert procs[0].poll() is None, logs["server"].read_text()[-3000:]
        with temporary_settings(updates={PREFECT_API_URL: api}):
            # `r1 deploy`: creates the cpu and gpu process pools, registers infra/prefect.yaml
            proc = subprocess.run([sys.executable, "-m", "flows.cli", "deploy"], cwd=ROOT, capture_output=True,
                                  text=True, timeout=300)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            names = [line for line in proc.stdout.splitlines() if "/" in line and " " not in line]
            for name, pool in (("cpu-worker", "cpu"), ("gpu-worker", "gpu")):
                start(name, "worker", "start", "--pool", pool, "--name", name, "--type", "process")
            wait_for(lambda: all("started" in logs[w].read_text() for w in ("cpu-worker", "gpu-worker")), 120,
                     "both workers")
            yield {"names": names, "logs": logs, "store": env["R1_STORE"], "api": api}
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
        mp.undo()


def flow_runs_of_run(run: str) -> dict[str, list[Any]]:
    """flow name -> flow runs tagged with the r1 run name (stage runs) or named after it (the pipeline)."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        flows = {f.id: f.name for f in client.read_flows()}
        out: dict[str, list[Any]] = {}
        for fr in client.read_flow_runs():
            if f"run:{run}" in fr.tags or fr.name == run:
                out.setdefault(flows[fr.flow_id], []).append(fr)
        return out


def test_full_pipeline_dispatches_stages_to_their_pools(cluster: dict[str, Any]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment

    from tasks.storage.store import Store

    assert set(cluster["names"]) == {"r1-pipeline/cpu"} | {f"{s.flow_name}/{s.pool}" for s in all_stages()}
    assert {"prepare-data/cpu", "cold-start-sft/gpu", "grpo-train/gpu", "final-rl/gpu"} <= set(cluster["names"])
    # the Kubernetes GPU template passes the server's own validation of base job templates
    assert ensure_pool("gpu-k8s", "kubernetes")
    with get_client(sync_client=True) as client:
        assert client.read_work_pool("gpu-k8s").base_job_template == pool_template("kubernetes")

    # `prefect deployment run 'r1-pipeline/cpu' -p config_path=... -p run_name=...`: the run uses that file
    config_file = Path(cluster["store"]).parent / "tiny.yaml"
    config_file.write_text(yaml.safe_dump(tiny_config()))
    pipeline = run_deployment("r1-pipeline/cpu", timeout=900, poll_interval=1,
                              parameters={"config_path": str(config_file), "run_name": RUN})
    assert pipeline.state.is_completed(), f"{pipeline.state.type}: {pipeline.state.message}"
    saved = Store(cluster["store"]).read_run_file(RUN, "config.json")["config"]
    assert saved == load_config(config_file).model_dump(mode="json")
    assert pipeline.labels["prefect.worker.name"] == "cpu-worker"

    runs = flow_runs_of_run(RUN)
    ran = [s.name for s in all_stages() if s.enabled(load_config(config_file))]  # optional stages may be off
    assert {"prepare_data", "cold_start_sft", "grpo_train", "final_rl"} <= set(ran)
    worker_logs = {w: cluster["logs"][w].read_text() for w in ("cpu-worker", "gpu-worker")}
    with get_client(sync_client=True) as client:
        for stage in ran:
            (fr,) = runs[stage.replace("_", "-")]
            pool = POOL_OF[stage]
            assert fr.state.is_completed(), f"{stage}: {fr.state.type} {fr.state.message}"
            assert fr.work_pool_name == pool, stage
            assert fr.labels["prefect.worker.name"] == f"{pool}-worker", stage
            other = "gpu-worker" if pool == "cpu" else "cpu-worker"
            assert str(fr.id) in worker_logs[f"{pool}-worker"] and str(fr.id) not in worker_logs[other], stage
            # a child of the pipeline run (run_deployment as a subflow), not a free-standing run
            assert client.read_task_run(fr.parent_task_run_id).flow_run_id == pipeline.id, stage
    store = Store(cluster["store"])
    for stage in ran:
        assert store.latest(RUN, stage) is not None, f"{stage} committed nothing"


def test_single_stage_run_reuses_upstream_outputs_and_recovers_from_a_crash(cluster: dict[str, Any]) -> None:
    """``prefect deployment run 'grpo-train/gpu' -p run=wp-1`` for the existing run: upstream outputs come from
    the store (nothing upstream runs again). Its flow-run process is then killed mid-training: Prefect marks
    the run Crashed (flow retries do not apply), ``prefect flow-run retry`` reschedules it, and the rerun
    resumes from the store's newest checkpoint with every step logged once."""
    import signal

    from prefect.client.orchestration import get_client

    from tasks.storage.store import Store

    store = Store(cluster["store"])
    before = {stage: store.latest(RUN, stage) for stage in STAGES}
    if any(before[s] is None for s in ("prepare_data", "cold_start_sft", "grpo_train", "final_rl")):
        pytest.skip("needs the run of test_full_pipeline_dispatches_stages_to_their_pools")
    runs_before = flow_runs_of_run(RUN)
    cfg = tiny_config()
    cfg["grpo_train"].update(max_steps=8, save_steps=1)  # long enough to be killed between checkpoints

    # what a user types (plus a longer GRPO); the run's inputs come from the store
    proc = subprocess.run([sys.executable, "-m", "prefect", "deployment", "run", "grpo-train/gpu", "-p", f"run={RUN}",
                           "-p", f"config={json.dumps(cfg)}", "--tag", f"run:{RUN}"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (flow_run,) = [fr for fr in flow_runs_of_run(RUN)["grpo-train"]
                   if fr.id not in {r.id for r in runs_before["grpo-train"]}]

    def checkpointed() -> bool:
        return any((Path(cluster["store"]) / RUN / "grpo_train" / "_checkpoints").glob("*/checkpoint-*/_COMPLETE"))

    with get_client(sync_client=True) as client:
        wait_for(checkpointed, 300, "grpo_train's first checkpoint in the store")
        pid = int(str(client.read_flow_run(flow_run.id).infrastructure_pid).rsplit(":", 1)[-1])
        os.kill(pid, signal.SIGKILL)  # what an OOM kill or a lost node does to a stage
        wait_for(lambda: client.read_flow_run(flow_run.id).state.is_final(), 120, "the killed run's final state")
        assert client.read_flow_run(flow_run.id).state.type.value == "CRASHED"
        assert store.latest(RUN, "grpo_train").version == before["grpo_train"].version  # nothing committed

        # Prefect 3.9's process worker may report the killed attempt's exit (-9) a second time, late: landing after
        # a retry was scheduled, it crashes the run again before it started (retry again); landing while the worker
        # is putting the run back in motion, the retry is refused as not terminal (the run goes on by itself).
        # So: watch the run until it completes, retrying whenever it sits crashed by a -9.
        deadline, retries = time.monotonic() + 600, 0
        while True:
            final = client.read_flow_run(flow_run.id)
            if final.state.is_completed() or time.monotonic() > deadline:
                break
            killed = final.state.is_crashed() and (retries == 0 or "-9" in (final.state.message or ""))
            if killed and retries < 5:
                proc = subprocess.run([sys.executable, "-m", "prefect", "flow-run", "retry", str(flow_run.id)],
                                      cwd=ROOT, capture_output=True, text=True, timeout=120)
                assert proc.returncode == 0 or "cannot be retried" in proc.stdout, proc.stdout + proc.stderr
                retries += 1
            elif final.state.is_final():
                break  # failed, cancelled, or crashed otherwise: reported below
            time.sleep(1)
    assert final.state.is_completed(), final.state.message
    assert final.labels["prefect.worker.name"] == "gpu-worker"
    assert "resuming from the store's checkpoint at step" in flow_run_text_logs(flow_run.id)

    after = {stage: store.latest(RUN, stage) for stage in STAGES}
    new = after["grpo_train"]
    assert new.version != before["grpo_train"].version  # a new committed output ...
    parents = store.manifest(new)["parents"]
    for upstream in ("prepare_data", "cold_start_sft"):  # ... built from the committed upstream outputs
        assert after[upstream].version == before[upstream].version
        assert parents[upstream]["version"] == before[upstream].version
    runs_after = flow_runs_of_run(RUN)
    for flow_name in ("prepare-data", "cold-start-sft"):  # which did not run again
        assert len(runs_after[flow_name]) == len(runs_before[flow_name]) == 1
    steps = [json.loads(line)["step"] for line in store.read_text(f"{new.uri}/metrics.jsonl").splitlines()]
    assert steps == list(range(1, 9))  # no step lost or repeated across the crash


def flow_run_text_logs(flow_run_id: Any) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(log.message for log in logs)
