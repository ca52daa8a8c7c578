"""tasks.runner.launch: a stage's child processes (torchrun on CPU with gloo) stream their output into the task's
logger, and a failure in one rank raises with that rank's own traceback."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

from tasks.runner.launch import Nodes, StageProcessFailed, build_command, launch, resolve_nodes, resolve_nproc_per_node

ROOT = Path(__file__).resolve().parents[2]

ENTRY = '''
import os, sys
import torch.distributed as dist
from tasks.runner.launch import record_failure

def load_shard(rank):
    if rank == int(os.environ["FAIL_RANK"]):
        raise ValueError(f"shard {rank} is corrupt")
    return rank

@record_failure
def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    print(f"rank {rank} of {dist.get_world_size()} started", flush=True)
    load_shard(rank)
    dist.barrier()   # the healthy rank waits here for the failed one
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()

main()
'''


@pytest.fixture
def entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    (tmp_path / "r1_fake_stage.py").write_text(textwrap.dedent(ENTRY))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return "r1_fake_stage"


def run(entry: str, fail_rank: int, caplog: pytest.LogCaptureFixture, nproc: int = 2) -> None:
    logger = logging.getLogger("test-stage")
    with caplog.at_level(logging.INFO, logger="test-stage"):
        launch(entry, nproc_per_node=nproc, logger=logger, env={"FAIL_RANK": str(fail_rank)}, cwd=ROOT)


def test_two_ranks_complete_and_stream_their_output(entry: str, caplog: pytest.LogCaptureFixture) -> None:
    run(entry, fail_rank=-1, caplog=caplog)
    lines = caplog.messages
    assert any(line.endswith("rank 0 of 2 started") and line.startswith("[default0]") for line in lines)
    assert any(line.endswith("rank 1 done") and line.startswith("[default1]") for line in lines)


def test_failure_in_rank_1_raises_with_rank_1s_traceback(entry: str, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(StageProcessFailed) as info:
        run(entry, fail_rank=1, caplog=caplog)
    err = info.value
    assert err.rank == 1 and err.returncode != 0
    assert "ValueError: shard 1 is corrupt" in str(err)
    # the child's own frames, not torchrun's ChildFailedError summary
    assert 'in load_shard' in err.child_traceback and "r1_fake_stage.py" in err.child_traceback
    assert "ChildFailedError" not in err.child_traceback
    assert any("traceback of rank 1" in m and "in load_shard" in m for m in caplog.messages)  # in the task log


def test_single_process_failure_without_torchrun(entry: str, caplog: pytest.LogCaptureFixture,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # one process: plain `python -m`; WORLD_SIZE=1 makes the gloo group a group of one
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("RANK", "0")
    with pytest.raises(StageProcessFailed) as info:
        run(entry, fail_rank=0, caplog=caplog, nproc=1)
    assert info.value.rank == 0 and "shard 0 is corrupt" in str(info.value)


def test_a_killed_child_is_reported_with_its_signal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "r1_killed.py").write_text("import os, signal\nprint('about to die', flush=True)\n"
                                           "os.kill(os.getpid(), signal.SIGKILL)\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(StageProcessFailed, match="killed by SIGKILL") as info:
        launch("r1_killed")
    assert info.value.rank is None and "about to die" in str(info.value)


def test_nproc_comes_from_config_then_the_pools_job_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("R1_NPROC_PER_NODE", raising=False)
    assert resolve_nproc_per_node(None) == 1
    monkeypatch.setenv("R1_NPROC_PER_NODE", "4")
    assert resolve_nproc_per_node(None) == 4
    assert resolve_nproc_per_node(2) == 2
    monkeypatch.setenv("R1_NPROC_PER_NODE", "0")  # a CPU-only Kubernetes pod (gpu_count 0)
    assert resolve_nproc_per_node(None) == 1
    monkeypatch.setenv("R1_NPROC_PER_NODE", "two")
    with pytest.raises(ValueError, match="R1_NPROC_PER_NODE"):
        resolve_nproc_per_node(None)


def test_command_uses_torchrun_only_for_several_processes(tmp_path: Path) -> None:
    assert build_command("m", ["a"], 1, log_dir=tmp_path)[1:] == ["-m", "m", "a"]
    cmd = build_command("m", ["a"], 2, log_dir=tmp_path)
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node=2" in cmd and cmd[-3:] == ["-m", "m", "a"]


def test_nodes_come_from_the_pools_job_variables() -> None:
    assert resolve_nodes({}) == Nodes()  # unset: one node
    assert resolve_nodes({"R1_NNODES": "1", "R1_NODE_RANK": "0", "R1_RDZV_ENDPOINT": "", "R1_RDZV_ID": ""}) == Nodes()
    env = {"R1_NNODES": "4", "R1_NODE_RANK": "3", "R1_RDZV_ENDPOINT": "job-0.r1-rdzv:29400", "R1_RDZV_ID": "job"}
    assert resolve_nodes(env) == Nodes(4, 3, "job-0.r1-rdzv:29400", "job")
    assert resolve_nodes({**env, "R1_RDZV_ID": ""}, default_rdzv_id="run-stage").rdzv_id == "run-stage"
    with pytest.raises(ValueError, match="R1_NODE_RANK=4 with R1_NNODES=4"):
        resolve_nodes({**env, "R1_NODE_RANK": "4"})
    with pytest.raises(ValueError, match="needs R1_RDZV_ENDPOINT=HOST:PORT"):
        resolve_nodes({**env, "R1_RDZV_ENDPOINT": ""})
    with pytest.raises(ValueError, match="R1_NNODES='two'"):
        resolve_nodes({**env, "R1_NNODES": "two"})


def test_several_nodes_use_the_c10d_rendezvous(tmp_path: Path) -> None:
    nodes = Nodes(2, 1, "10.0.0.5:29400", "run-7")
    cmd = build_command("m", ["a"], 1, log_dir=tmp_path, nodes=nodes)  # one process per node still needs torchrun
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--standalone" not in cmd
    assert cmd[3:9] == ["--nnodes=2", "--node-rank=1", "--rdzv-backend=c10d", "--rdzv-endpoint=10.0.0.5:29400",
                        "--rdzv-id=run-7", "--nproc-per-node=1"]
    assert cmd[-3:] == ["-m", "m", "a"]


def test_children_get_a_passive_openmp_wait_policy_unless_set(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "r1_env_probe.py").write_text("import os\nprint('policy', os.environ.get('OMP_WAIT_POLICY'))\n")
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{ROOT}")
    logger = logging.getLogger("test-stage")

    def child_policy() -> str:
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="test-stage"):
            launch("r1_env_probe", logger=logger, cwd=ROOT)
        return next(m.split()[1] for m in caplog.messages if m.startswith("policy "))

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    assert child_policy() == "PASSIVE"  # idle OpenMP threads do not spin beside other work
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert child_policy() == "ACTIVE"  # the user's own value wins

