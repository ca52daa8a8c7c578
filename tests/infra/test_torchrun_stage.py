"""The GRPO stage under ``torchrun --nproc_per_node 2`` on CPU (gloo), through the grpo_train task, the way a
work pool asks for it (``R1_NPROC_PER_NODE``, set by the pool's job template); a failure injected into
rank 1 fails the task with rank 1's own traceback in the Prefect log; and two "nodes" on this machine (the
task on node 0, ``tasks.runner.follower`` on node 1, each starting ``torchrun --nnodes 2`` on one c10d rendezvous at
127.0.0.1, as the multi-node pool's ``R1_NNODES``/``R1_NODE_RANK``/``R1_RDZV_ENDPOINT`` ask) train like one process."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any, Iterator

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.extended]

ROOT = Path(__file__).resolve().parents[2]
RUN = "torchrun-1"

# Loaded at interpreter start by every Python process that has this folder on PYTHONPATH; acts only in
# torchrun's rank 1 (the agent has no RANK) and only when the test asks for it.
INJECT = '''
import os
if os.environ.get("RANK") == "1" and os.environ.get("R1_TEST_FAIL_RANK") == "1":
    import grpo_core.trainer.step as step

    def optimise_in_rank_1(*args, **kwargs):
        raise RuntimeError("injected failure in rank 1")

    step.optimise = optimise_in_rank_1
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

    from tasks.config.pipeline import load_config
    from tasks.config.stages import get_stage

    prepare_data, cold_start_sft = get_stage("prepare_data").task, get_stage("cold_start_sft").task

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


def run_grpo(upstream: dict[str, Any], config: Any = None) -> Any:
    """The grpo_train task inside a flow (with ``config``, default the upstream's); returns the flow's final state."""
    from prefect import flow

    from tasks.config.stages import get_stage

    grpo_train = get_stage("grpo_train").task

    @flow(name="grpo-under-torchrun")
    def grpo_only() -> Any:
        return grpo_train.with_options(retries=0)(config or upstream["config"], RUN, upstream["store"],
                                                  upstream["inputs"], True)

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
    from tasks.storage.store import Store

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
    from tasks.storage.store import Store

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


DIGIT_REWARD = '''
from grpo_core.rewards.base import register_reward


@register_reward("test_digit_fraction")
def test_digit_fraction(completions, **kwargs):
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]
'''


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_match_one_process(upstream: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node 0 is the grpo_train task (this process's flow run), node 1 ``python -m tasks.runner.follower``, as the
    multi-node pool starts them; each runs ``torchrun --nnodes 2`` with one process, on one c10d rendezvous."""
    from tasks.storage.store import Store
    from tasks.runner.training import read_history

    # The untrained tiny model never scores on chain_accuracy (all-zero advantages, a flat curve): reward the
    # share of digits instead, registered in every process this test starts, and take larger steps.
    (tmp_path / "sitecustomize.py").write_text(DIGIT_REWARD)
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("R1_NPROC_PER_NODE", raising=False)
    config = upstream["config"].model_copy(deep=True)
    config.grpo_train.reward_funcs = ["test_digit_fraction"]
    config.grpo_train.learning_rate = 5e-3
    one = run_grpo(upstream, config)  # the reference: one training process
    assert one.is_completed(), one.message
    one_ref = one.result()

    nodes = {"R1_NNODES": "2", "R1_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}", "R1_RDZV_ID": "two-nodes",
             "R1_NPROC_PER_NODE": "1"}
    follower = subprocess.Popen(  # started first: it waits for node 0's spec in the store
        [sys.executable, "-m", "tasks.runner.follower"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        text=True, env={**os.environ, **nodes, "R1_NODE_RANK": "1", "R1_STORE": upstream["store"],
                        "R1_WORKDIR": str(tmp_path / "node1"), "R1_FOLLOWER_WAIT_S": "600"})
    for key, value in {**nodes, "R1_NODE_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    try:
        two = run_grpo(upstream, config)
    finally:
        out = follower.communicate(timeout=600)[0]
    assert two.is_completed(), f"{two.message}\n--- node 1 ---\n{out[-4000:]}"
    assert follower.returncode == 0, out[-4000:]
    assert "--nnodes=2 --node-rank=1 --rdzv-backend=c10d" in out and "training finished" in out
    logs = flow_run_logs(two.state_details.flow_run_id)
    assert "--nnodes=2 --node-rank=0 --rdzv-backend=c10d" in logs

    store = Store(upstream["store"])
    two_ref = two.result()
    assert store.latest(RUN, "grpo_train").version == two_ref.version != one_ref.version
    assert not store.exists(store.node_spec_path("two-nodes"))  # node 0 cleaned up its hand-over
    one_curve, two_curve = read_history(store, one_ref), read_history(store, two_ref)
    assert [m["step"] for m in two_curve] == [m["step"] for m in one_curve] == [1, 2]
    print("two nodes vs one process, max |loss diff|:", max(abs(a["loss"] - b["loss"]) for a, b in zip(one_curve, two_curve)),
          "losses:", [m["loss"] for m in one_curve], "kl:", [m["kl"] for m in one_curve])
    for a, b in zip(one_curve, two_curve):
        assert a["reward"] == b["reward"]  # the same completions
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a["step"], a["loss"], b["loss"])
        assert abs(a["kl"] - b["kl"]) < 1e-5, (a["step"], a["kl"], b["kl"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5 * max(1.0, a["grad_norm"])
    assert one_curve[0]["loss"] != 0 and one_curve[-1]["kl"] > 0  # a moving curve: agreement is not trivial
