"""The GRPO stage under ``torchrun --nproc_per_node 2`` on CPU (gloo), through the grpo_train task, the way a
work pool asks for it (``R1_NPROC_PER_NODE``, set by the pool's job template); and a failure injected into
rank 1 fails the task with rank 1's own traceback in the Prefect log."""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
RUN = "torchrun-1"

# Loaded at interpreter start by every Python process that has this folder on PYTHONPATH; acts only in
# torchrun's rank 1 (the agent has no RANK) and only when the test asks for it.
INJECT = '''
import os
if os.environ.get("RANK") == "1" and os.environ.get("R1_TEST_FAIL_RANK") == "1":
    import grpo_core.trainer.loop as loop

    def optimise_in_rank_1(*args, **kwargs):
        raise RuntimeError("injected failure in rank 1")

    loop.optimise = optimise_in_rank_1
'''


@pytest.fixture(scope="module")
def prefect() -> Iterator[None]:
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="module")
def upstream(prefect: None, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """prepare_data and cold_start_sft of configs/ci-tiny.yaml, committed to a local store."""
    from prefect import flow

    from tasks.config import load_config
    from tasks.cold_start_sft import cold_start_sft
    from tasks.prepare_data import prepare_data

    store = str(tmp_path_factory.mktemp("store"))
    cfg = load_config(ROOT / "configs" / "ci-tiny.yaml")
    cfg.grpo_train.max_steps = 2
    cfg.grpo_train.save_steps = 1

    @flow
    def upstream_stages() -> dict[str, Any]:
        data = prepare_data(cfg, RUN, store, {}, False)
        sft = cold_start_sft(cfg, RUN, store, {"prepare_data": data}, False)
        return {"prepare_data": data, "cold_start_sft": sft}

    inputs = upstream_stages()  # ci-tiny trains inline: no child process to start
    cfg.run.isolation = "subprocess"  # the training child: torchrun when R1_NPROC_PER_NODE > 1
    return {"store": store, "config": cfg, "inputs": inputs}


def run_grpo(upstream: dict[str, Any]) -> Any:
    """The grpo_train task inside a flow; returns the flow's final state."""
    from prefect import flow

    from tasks.grpo_train import grpo_train

    @flow(name="grpo-under-torchrun")
    def grpo_only() -> Any:
        return grpo_train.with_options(retries=0)(upstream["config"], RUN, upstream["store"], upstream["inputs"], True)

    return grpo_only(return_state=True)


def flow_run_logs(flow_run_id: Any) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # send the queued log lines before reading them back
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
    return "\n".join(log.message for log in logs)


@pytest.fixture
def two_ranks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    (tmp_path / "sitecustomize.py").write_text(textwrap.dedent(INJECT))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    monkeypatch.setenv("R1_NPROC_PER_NODE", "2")  # what the GPU pool's job template sets from gpu_count
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path


def test_grpo_stage_completes_under_torchrun(upstream: dict[str, Any], two_ranks: Path) -> None:
    from tasks.store import Store

    state = run_grpo(upstream)
    assert state.is_completed(), state.message
    ref = state.result()
    logs = flow_run_logs(state.state_details.flow_run_id)
    assert "torch.distributed.run --standalone --nproc-per-node=2" in logs
    store = Store(upstream["store"])
    assert store.latest(RUN, "grpo_train").version == ref.version
    assert store.exists(f"{ref.uri}/model/model.safetensors") or store.exists(f"{ref.uri}/model/config.json")


def test_rank_1_failure_fails_the_task_with_rank_1s_traceback(upstream: dict[str, Any], two_ranks: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from tasks.store import Store

    before = Store(upstream["store"]).latest(RUN, "grpo_train")
    monkeypatch.setenv("R1_TEST_FAIL_RANK", "1")
    state = run_grpo(upstream)
    assert state.is_failed()
    message = str(state.result(raise_on_failure=False))
    assert "rank 1" in message and "RuntimeError: injected failure in rank 1" in message
    logs = flow_run_logs(state.state_details.flow_run_id)
    assert "traceback of rank 1" in logs
    assert "in optimise_in_rank_1" in logs  # rank 1's own frame, not torchrun's ChildFailedError summary
    after = Store(upstream["store"]).latest(RUN, "grpo_train")
    assert (after and after.version) == (before and before.version)  # nothing new committed
