"""FSDP2 (distributed_strategy="fsdp") on 2 CPU processes (gloo) trains like 1 unsharded process, and resumes from
its sharded checkpoints (and in one process from them).

The two-process run is this file under torchrun (it trains 2 steps, then resumes to step 4):

    torchrun --standalone --nproc_per_node 2 tests/grpo_core/test_trainer_fsdp.py MODEL_DIR OUTPUT_DIR
    torchrun --standalone --nproc_per_node 2 tests/grpo_core/test_trainer_fsdp.py helpers   (fast checks)
"""

from __future__ import annotations

import shutil
import sys

import pytest
import torch

from tests.grpo_core.run_helpers import read_metrics, run_torchrun

ROWS = [{"prompt": [{"role": "user", "content": f"{i}-{i % 3}="}], "answer": str(i - i % 3)} for i in range(10)]


def digit_fraction(completions, **kwargs):
    texts = [c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def config(max_steps: int, strategy: str):
    from grpo_core.config import GRPOConfig

    # 16 completions in 3 optimiser steps (6/5/5 sequences): with micro-batches of 2, a rank holding
    # 3 sequences runs 2 micro-batches and its partner holding 2 runs 1, plus an FSDP filler.
    # beta > 0 shards the reference model too; mu = 2 computes old log-probs (no-grad forwards).
    return GRPOConfig(
        use_vllm=False, max_steps=max_steps, generation_batch_size=16, num_generations=4, max_completion_length=8,
        max_prompt_length=16, per_device_train_batch_size=2, learning_rate=5e-3, beta=0.04, loss_type="dapo",
        steps_per_generation=3, num_iterations=2, save_steps=2, seed=3, report_to=["jsonl"], torch_num_threads=1,
        distributed_strategy=strategy,
    )


def run(model_dir: str, output_dir: str, max_steps: int, strategy: str, resume: bool) -> None:
    from grpo_core.trainer.loop import train_grpo

    train_grpo(config(max_steps, strategy), model_dir, ROWS, output_dir, reward_funcs=[digit_fraction], resume=resume)


def _assert_same_curve(reference: list[dict], other: list[dict]) -> None:
    for a, b in zip(reference, other, strict=True):
        assert a["step"] == b["step"]
        assert a["reward"] == b["reward"]  # same completions: the replica samples the same weights
        assert abs(a["loss"] - b["loss"]) < 1e-5, (a["step"], a["loss"], b["loss"])
        assert abs(a["kl"] - b["kl"]) < 1e-5, (a["step"], a["kl"], b["kl"])
        assert abs(a["grad_norm"] - b["grad_norm"]) < 1e-5 * max(1.0, a["grad_norm"])


@pytest.mark.slow
def test_fsdp_two_processes_match_one_and_resume_from_their_checkpoints(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from grpo_core.models.tiny import build_tiny_model

    torch.set_num_threads(1)
    model_dir = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=2, num_heads=2)
    run_torchrun(__file__, str(model_dir), str(tmp_path / "fsdp"), timeout=400)
    run(str(model_dir), str(tmp_path / "one"), 4, "ddp", resume=False)

    one, fsdp = read_metrics(tmp_path / "one"), read_metrics(tmp_path / "fsdp")
    assert [m["step"] for m in fsdp] == [1, 2, 3, 4]  # 2 steps, then resumed from checkpoint-2: none twice
    _assert_same_curve(one, fsdp)
    assert len({m["loss"] for m in one}) > 1  # the curve moves, so agreement is not trivial

    # Gathered checkpoints are ordinary save_pretrained folders with the 1-process file layout.
    final = AutoModelForCausalLM.from_pretrained(tmp_path / "fsdp" / "final")
    w1 = load_file(tmp_path / "one" / "final" / "model.safetensors")
    for name, tensor in final.state_dict().items():
        if name in w1:
            torch.testing.assert_close(tensor, w1[name], atol=1e-4, rtol=0)
    assert set(w1) == set(load_file(tmp_path / "fsdp" / "final" / "model.safetensors"))
    # Checkpoints are sharded (DCP): one file per rank holding its shards of weights and Adam moments.
    checkpoint = tmp_path / "fsdp" / "checkpoint-4"
    assert sorted(p.name for p in (checkpoint / "state").iterdir()) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    assert not (checkpoint / "optimizer.pt").exists() and not (checkpoint / "model.safetensors").exists()

    # An FSDP checkpoint resumes in a single unsharded process (DCP reshards) and continues the same curve.
    (tmp_path / "mixed").mkdir()
    shutil.copytree(tmp_path / "fsdp" / "checkpoint-2", tmp_path / "mixed" / "checkpoint-2")
    run(str(model_dir), str(tmp_path / "mixed"), 4, "ddp", resume=True)
    _assert_same_curve(one[2:], read_metrics(tmp_path / "mixed")[-2:])


def check_helpers() -> None:
    """Under torchrun: sharded gradients equal the unsharded ones (tied and untied heads, with gradient
    checkpointing), and the optimizer state survives gather -> load onto fresh shards unchanged."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_core.trainer.logprobs import compute_token_logps
    from grpo_core.trainer.distributed import init_distributed
    from grpo_core.trainer.fsdp import gather_model_state, gather_optimizer_state, load_full_optimizer_state, shard_model

    torch.set_num_threads(1)
    ctx = init_distributed()
    for tied in (True, False):
        torch.manual_seed(0)
        cfg = Qwen2Config(vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=2, tie_word_embeddings=tied)
        full, model = Qwen2ForCausalLM(cfg), Qwen2ForCausalLM(cfg)
        model.load_state_dict(full.state_dict())
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        shard_model(model, ctx)
        ids = torch.randint(0, 40, (4, 9))  # [4, 9], 2 rows per rank
        mask = torch.ones_like(ids)
        logps, _ = compute_token_logps(full, ids, mask, 5, chunk_size=3)  # [4, 5]
        logps.sum().backward()
        mine = slice(2 * ctx.rank, 2 * ctx.rank + 2)
        for _ in range(2):  # two micro-batches accumulate: the sharded grads hold twice this rank's share
            local, _ = compute_token_logps(model, ids[mine], mask[mine], 5, chunk_size=3)  # [2, 5]
            local.sum().backward()
        for (name, p), q in zip(model.named_parameters(), full.parameters(), strict=True):
            torch.testing.assert_close(p.grad.full_tensor(), 2 * q.grad, atol=1e-5, rtol=1e-5, msg=name)

        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        optimizer.step()
        saved = gather_optimizer_state(optimizer, ctx)
        weights = gather_model_state(model)
        if ctx.is_main:
            assert weights.keys() == full.state_dict().keys()
            assert [tuple(s["exp_avg"].shape) for s in saved["state"].values()] == [tuple(q.shape) for q in full.parameters()]
        saved = [saved]
        torch.distributed.broadcast_object_list(saved, src=0)
        fresh = torch.optim.AdamW(model.parameters(), lr=1e-2)
        load_full_optimizer_state(fresh, saved[0])
        for p in model.parameters():
            for key in ("exp_avg", "exp_avg_sq"):
                torch.testing.assert_close(fresh.state[p][key].to_local(), optimizer.state[p][key].to_local())
    if ctx.is_main:
        print("helpers ok")


def test_fsdp_gradients_and_optimizer_state_round_trip(tmp_path):
    assert "helpers ok" in run_torchrun(__file__, "helpers", timeout=300)


if __name__ == "__main__":
    if sys.argv[1] == "helpers":
        check_helpers()
    else:
        run(sys.argv[1], sys.argv[2], 2, "fsdp", resume=False)
        run(sys.argv[1], sys.argv[2], 4, "fsdp", resume=True)
