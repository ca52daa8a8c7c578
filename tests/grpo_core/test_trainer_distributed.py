"""Two processes under torchrun (gloo) with distributed_strategy="ddp" (replicas; FSDP, the default, is
test_trainer_fsdp.py) train exactly like one process with the same global batch.

The two-process run is this file under torchrun:

    torchrun --standalone --nproc_per_node 2 tests/grpo_core/test_trainer_distributed.py MODEL_DIR OUTPUT_DIR
"""

from __future__ import annotations

import sys

import pytest
import torch

from tests.grpo_core.run_helpers import read_metrics, run_torchrun

ROWS = [{"prompt": [{"role": "user", "content": f"{i}-{i % 3}="}], "answer": str(i - i % 3)} for i in range(10)]


def digit_fraction(completions, **kwargs):
    texts = [c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def config():
    from grpo_core.config import GRPOConfig

    # 4 prompts x 4 completions per step; micro-batches of 3 leave ragged shards on each rank.
    return GRPOConfig(
        use_vllm=False, max_steps=4, generation_batch_size=16, num_generations=4, max_completion_length=8,
        max_prompt_length=16, per_device_train_batch_size=3, learning_rate=5e-3, beta=0.04, loss_type="dapo",
        save_steps=2, seed=3, report_to=["jsonl"], torch_num_threads=1, distributed_strategy="ddp",
    )


def run(model_dir: str, output_dir: str) -> None:
    from grpo_core.trainer.loop import train_grpo

    train_grpo(config(), model_dir, ROWS, output_dir, reward_funcs=[digit_fraction], resume=False)


@pytest.mark.slow
def test_two_processes_give_the_loss_curve_of_one(tmp_path):
    from safetensors.torch import load_file

    from grpo_core.models.tiny import build_tiny_model

    torch.set_num_threads(1)
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=2, num_heads=2)
    run_torchrun(__file__, str(model_dir), str(tmp_path / "two"), timeout=300)
    run(str(model_dir), str(tmp_path / "one"))

    one, two = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "two")
    assert [m["step"] for m in two] == [1, 2, 3, 4]  # rank 0 alone writes metrics
    for a, b in zip(one, two):
        assert a["reward"] == b["reward"]  # same completions: seeds follow the prompt, not the rank
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a["step"], a["loss"], b["loss"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5 * max(1.0, a["grad_norm"])
    assert len({m["loss"] for m in one}) > 1  # the curve moves, so agreement is not trivial
    w1, w2 = load_file(tmp_path / "one" / "final" / "model.safetensors"), load_file(tmp_path / "two" / "final" / "model.safetensors")
    for name in w1:
        torch.testing.assert_close(w2[name], w1[name], atol=1e-4, rtol=0)
    assert sorted(p.name for p in (tmp_path / "two").glob("checkpoint-*")) == ["checkpoint-2", "checkpoint-4"]


if __name__ == "__main__":
    run(sys.argv[1], sys.argv[2])
