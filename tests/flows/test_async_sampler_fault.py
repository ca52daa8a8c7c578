"""A killed sampler under ``async_rollouts``, through the real grpo_train task with Prefect retries.

The GRPO stage of configs/ci-tiny.yaml runs one-step-off asynchronous rollouts in its training child
(``run.isolation: subprocess``); after its first checkpoint reaches the store the sampler process (the
child's ``multiprocessing`` spawn) is SIGKILLed. The attempt must fail well within ``async_sampler_timeout``
with an error naming that sampler process, and Prefect's retry must resume from the store's newest checkpoint
and finish with every step logged once.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN = "async-fault"
SAMPLER_TIMEOUT = 30.0
MAX_STEPS = 30


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """prepare_data and cold_start_sft of configs/ci-tiny.yaml committed to a local store (inline: no child)."""
    from prefect import flow

    from tasks.config.pipeline import load_config
    from tasks.config.stages import get_stage

    prepare_data, cold_start_sft = get_stage("prepare_data").task, get_stage("cold_start_sft").task

    store = str(tmp_path_factory.mktemp("store"))
    cfg = load_config(ROOT / "configs" / "ci-tiny.yaml")

    @flow
    def upstream_stages() -> dict[str, Any]:
        data = prepare_data(cfg, RUN, store, {}, False)
        return {"prepare_data": data, "cold_start_sft": cold_start_sft(cfg, RUN, store, {"prepare_data": data}, False)}

    return {"store": store, "config": cfg, "inputs": upstream_stages()}


def _worker_and_sampler() -> tuple[psutil.Process | None, psutil.Process | None]:
    """The training child (``tasks.runner.worker``) and its sampler process (a ``multiprocessing`` spawn)."""
    for proc in psutil.Process().children(recursive=True):
        try:
            if "tasks.runner.worker" in " ".join(proc.cmdline()):
                samplers = [c for c in proc.children() if "spawn_main" in " ".join(c.cmdline())]
                return proc, (samplers[0] if samplers else None)
        except psutil.NoSuchProcess:
            continue
    return None, None


def _alive(proc: psutil.Process) -> bool:
    """Running and not yet a zombie (never ``wait()``: that would reap the launcher's child and hide its exit code)."""
    try:
        return proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.extended
@pytest.mark.slow
def test_killed_sampler_fails_the_attempt_in_time_and_the_retry_resumes(upstream: dict[str, Any]) -> None:
    import threading

    from prefect import flow

    from tasks.config.stages import get_stage
    from tasks.storage.store import Store
    from tasks.runner.training import read_history

    grpo_train = get_stage("grpo_train").task

    cfg = upstream["config"].model_copy(deep=True)
    cfg.grpo_train = cfg.grpo_train.model_copy(update={
        "async_rollouts": True, "async_sampler_timeout": SAMPLER_TIMEOUT, "max_steps": MAX_STEPS, "save_steps": 2})
    cfg.run.isolation = "subprocess"

    @flow(name="grpo-async-fault")
    def grpo_only() -> Any:
        return grpo_train.with_options(retries=1, retry_delay_seconds=0)(cfg, RUN, upstream["store"],
                                                                          upstream["inputs"], True)

    done: dict[str, Any] = {}
    thread = threading.Thread(target=lambda: done.update(state=grpo_only(return_state=True)))
    thread.start()
    store = Store(upstream["store"])
    checkpoints = Path(upstream["store"]) / RUN / "grpo_train" / "_checkpoints"
    killed = worker = None
    deadline = time.monotonic() + 300
    while killed is None and time.monotonic() < deadline and thread.is_alive():
        if list(checkpoints.glob("*/checkpoint-*/_COMPLETE")):
            worker, sampler = _worker_and_sampler()
            if sampler is not None:
                sampler.kill()
                killed_at, killed = time.monotonic(), sampler.pid
        time.sleep(0.02)
    assert killed is not None, "the stage finished or never checkpointed before its sampler could be killed"
    while _alive(worker) and time.monotonic() - killed_at < SAMPLER_TIMEOUT + 30:  # the attempt's training child ends ...
        time.sleep(0.05)
    failed_after = time.monotonic() - killed_at
    thread.join(timeout=300)
    assert not thread.is_alive(), "the retried stage did not finish within 300 s"
    print(f"attempt failed {failed_after:.1f} s after the sampler was killed")
    assert failed_after < SAMPLER_TIMEOUT  # ... within the configured timeout, not after a hang

    state = done["state"]
    assert state.is_completed(), state.message
    logs = _flow_run_logs(state.state_details.flow_run_id)
    named = [line for line in logs.splitlines() if f"SamplerCrashed: sampler process (pid {killed}, hf backend)" in line]
    assert named and "code -9" in named[0], logs[-3000:]  # the first attempt's error names the killed sampler
    runs = [t for t in _task_runs(state.state_details.flow_run_id) if t.name.startswith("grpo_train")]
    assert len(runs) == 1 and runs[0].run_count == 2  # Prefect retried the task once, in place

    manifest = store.manifest(store.latest(RUN, "grpo_train"))
    assert 2 <= manifest["training"]["resumed_from_step"] < MAX_STEPS
    history = read_history(store, state.result())
    assert [m["step"] for m in history] == list(range(1, MAX_STEPS + 1))  # no step lost or repeated
    resumed = manifest["training"]["resumed_from_step"]
    # the resumed attempt trains on the rollouts the checkpoint carried: stale by one step, never regenerated
    assert [m["async/staleness"] for m in history] == [0.0] + [1.0] * (MAX_STEPS - 1), resumed


def _task_runs(flow_run_id: Any) -> list[Any]:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter

    with get_client(sync_client=True) as client:
        return client.read_task_runs(flow_run_filter=FlowRunFilter(id={"any_": [flow_run_id]}))


def _flow_run_logs(flow_run_id: Any) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(log.message for log in logs)
