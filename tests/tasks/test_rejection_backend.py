"""rejection_sample samples with its own backend settings (``rejection_sample.sampling``), not grpo_train's
(issue 27: it used grpo_train's use_vllm, vLLM memory share and bf16 without saying so)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import grpo_core.generation
from grpo_core.models.tiny import build_tiny_model
import grpo_core.recipe.rejection
from tasks.config.pipeline import load_config
from tasks.config.stages import get_stage
from tasks.stages.rejection_sample import _sample

ROOT = Path(__file__).resolve().parents[2]


def test_rejection_sampling_builds_its_backend_from_its_own_section(tmp_path, monkeypatch):
    model = build_tiny_model(tmp_path / "m", hidden_size=32, num_layers=1, num_heads=2, max_position_embeddings=128)
    config = load_config(ROOT / "configs" / "ci-tiny.yaml")
    data = config.model_dump()
    data["grpo_train"]["sampling"].update(use_vllm=False, vllm_gpu_memory_utilization=0.3)
    data["rejection_sample"]["sampling"].update(use_vllm=True, vllm_gpu_memory_utilization=0.55,
                                                max_prompt_length=40, max_completion_length=20)
    config = type(config).model_validate(data)
    built, sampled = [], []
    monkeypatch.setattr(grpo_core.generation, "make_backend",
                        lambda kind, path, **opts: built.append((kind, opts)) or "backend")
    monkeypatch.setattr(grpo_core.recipe.rejection, "rejection_sample",
                        lambda section, backend, tokenizer, rows: sampled.append((section, backend)) or ([], {}))
    entry = get_stage("rejection_sample")
    _sample(SimpleNamespace(config=config, stage=entry.name, entry=entry, section=entry.section_of(config)), str(model),
            [], {})
    (kind, opts), = built
    assert kind == "vllm" and opts["gpu_memory_utilization"] == 0.55 and opts["max_model_len"] == 60
    assert sampled == [(config.rejection_sample, "backend")]
