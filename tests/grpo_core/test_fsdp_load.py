"""The sharded FSDP load (meta device, rank 0 reads, rows scattered) gives the weights and outputs of an
ordinary ``from_pretrained``, and a file that does not fit the config fails on every rank with the reason.

The two-process checks are this file under torchrun:

    torchrun --standalone --nproc_per_node 2 tests/grpo_core/test_fsdp_load.py FOLDER
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def save_models(folder: Path) -> None:
    """Tied and untied Qwen2 models whose row counts do not split evenly over 2 ranks (41-token vocabulary),
    and a copy of the tied one whose config asks for a layer its file lacks."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    for tied in (True, False):
        torch.manual_seed(int(tied))
        cfg = Qwen2Config(vocab_size=41, hidden_size=16, intermediate_size=30, num_hidden_layers=2,
                          num_attention_heads=2, num_key_value_heads=1, tie_word_embeddings=tied)
        Qwen2ForCausalLM(cfg).save_pretrained(folder / f"tied-{tied}")
    shutil.copytree(folder / "tied-True", folder / "wrong")
    config = json.loads((folder / "wrong" / "config.json").read_text())
    config["num_hidden_layers"] = 3
    config.pop("layer_types", None)  # recomputed for 3 layers
    (folder / "wrong" / "config.json").write_text(json.dumps(config))


def check(folder: Path) -> None:
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    from grpo_core.trainer.logprobs import compute_token_logps
    from grpo_core.trainer.distributed import init_distributed
    from grpo_core.trainer.fsdp import gather_model_state, load_sharded_model

    torch.set_num_threads(1)
    ctx = init_distributed()
    ids = torch.randint(0, 41, (2, 7), generator=torch.Generator().manual_seed(0))  # [2, 7]
    for tied in (True, False):
        path = folder / f"tied-{tied}"
        model = load_sharded_model(path, ctx, gradient_checkpointing=True, bf16=not tied)  # bf16: GPU only
        assert all(p.requires_grad and p.dtype == torch.float32 for p in model.parameters()) and model.training
        state = gather_model_state(model)
        full = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if ctx.is_main:
            saved = load_file(path / "model.safetensors")
            for name, tensor in saved.items():
                assert torch.equal(state[name], tensor), name
        # the forward also needs the non-persistent buffers (rotary inv_freq), which no file holds
        sharded_logps, _ = compute_token_logps(model, ids, torch.ones_like(ids), 4)  # [2, 4]
        model.reshard()
        full_logps, _ = compute_token_logps(full, ids, torch.ones_like(ids), 4)  # [2, 4]
        torch.testing.assert_close(sharded_logps, full_logps, atol=1e-6, rtol=0)
        frozen = load_sharded_model(path, ctx, trainable=False)
        assert not any(p.requires_grad for p in frozen.parameters()) and not frozen.training
    try:
        load_sharded_model(folder / "wrong", ctx)
    except ValueError as e:
        assert "no tensor named model.layers.2." in str(e), e
        print(f"rank {ctx.rank} refused: {e}", flush=True)
    if ctx.is_main:
        print("sharded load ok", flush=True)


def test_auto_shards_whenever_several_ranks_run():
    from pydantic import ValidationError

    from grpo_core.config import GRPOConfig, SFTConfig
    from grpo_core.trainer.distributed import DistContext
    from grpo_core.trainer.skeleton import uses_fsdp

    one, two = (DistContext(rank=0, world_size=n, local_rank=0, device=torch.device("cpu")) for n in (1, 2))
    assert SFTConfig().distributed_strategy == GRPOConfig().distributed_strategy == "auto"
    assert uses_fsdp(SFTConfig(), two) and not uses_fsdp(SFTConfig(), one)
    assert uses_fsdp(GRPOConfig(distributed_strategy="fsdp"), two) and not uses_fsdp(GRPOConfig(distributed_strategy="fsdp"), one)
    assert not uses_fsdp(SFTConfig(distributed_strategy="ddp"), two)
    assert SFTConfig(fsdp_cpu_offload=True).fsdp_cpu_offload
    with pytest.raises(ValidationError, match="distributed_strategy"):
        SFTConfig(distributed_strategy="zero3")


@pytest.mark.extended
@pytest.mark.slow
def test_sharded_load_matches_from_pretrained_and_names_a_missing_tensor(tmp_path):
    save_models(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", __file__,
         str(tmp_path)], env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "sharded load ok" in proc.stdout
    assert "rank 0 refused" in proc.stdout and "rank 1 refused" in proc.stdout  # no rank left waiting


if __name__ == "__main__":
    check(Path(sys.argv[1]))
