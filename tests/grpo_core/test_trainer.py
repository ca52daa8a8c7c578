"""The GRPO trainer on a tiny model: learning, micro-batch invariance, checkpoints, config errors."""

from __future__ import annotations

import json
import logging
import math

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import load_file

from grpo_core.config import GRPOConfig
from grpo_core.generation import Rollout
from grpo_core.generation.prompts import PromptStream, encode_prompt
from grpo_core.models.tiny import build_tiny_model
from grpo_core.seeds import derive_seed
from grpo_core.trainer.checkpoint import CheckpointError, list_checkpoints, load_latest_checkpoint, verify_checkpoint
from grpo_core.trainer.loop import train_grpo
from grpo_core.trainer.loss import combine_rewards
from grpo_core.trainer.rollouts import ScoredGroups, collect_step_groups

torch.set_num_threads(1)

ROWS = [{"prompt": [{"role": "user", "content": f"{i}+{i}="}], "answer": str(2 * i)} for i in range(20)]


def digit_fraction(completions, **kwargs):
    """Share of completion characters that are digits: ~4% for a random byte-level model."""
    texts = [c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def small_config(**overrides) -> GRPOConfig:
    fields = dict(
        use_vllm=False, max_steps=3, generation_batch_size=16, num_generations=4, max_completion_length=8,
        max_prompt_length=32, per_device_train_batch_size=16, learning_rate=1e-2, beta=0.0, save_steps=100,
        report_to=["jsonl"], reward_funcs=["digit_fraction"],
    )
    fields.update(overrides)
    return GRPOConfig(**fields)


def read_metrics(output_dir) -> list[dict]:
    return [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=2, num_heads=2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_reward_rises_on_a_task_the_policy_starts_weak_on(tmp_path, seed):
    path = build_tiny_model(tmp_path / "tiny", hidden_size=32, num_layers=2, num_heads=2, seed=seed)
    config = small_config(max_steps=15, generation_batch_size=64, num_generations=8, per_device_train_batch_size=64, seed=seed)
    out = train_grpo(config, path, ROWS, tmp_path / "run", reward_funcs=[digit_fraction], resume=False)
    rewards = [m["reward"] for m in read_metrics(tmp_path / "run")]
    assert len(rewards) == 15 and out["step"] == 15
    start, end = sum(rewards[:3]) / 3, sum(rewards[-3:]) / 3
    assert start < 0.1  # weak at the start: ~1 digit in 25 bytes
    assert end > start + 0.15, rewards  # measured: 0.04 -> 0.45-0.6 after 15 steps in every seed


def test_micro_batches_give_the_full_batch_update(tmp_path, tiny_path):
    """Global normalisers: 16 sequences in micro-batches of 5 (ragged) == one batch of 16, for every loss type."""
    for loss_type in ("grpo", "dapo", "dr_grpo"):
        finals = []
        for bs in (16, 5):
            out_dir = tmp_path / f"{loss_type}-{bs}"
            config = small_config(max_steps=2, per_device_train_batch_size=bs, loss_type=loss_type, beta=0.04)
            train_grpo(config, tiny_path, ROWS, out_dir, reward_funcs=[digit_fraction], resume=False)
            finals.append((load_file(out_dir / "final" / "model.safetensors"), read_metrics(out_dir)))
        (w_full, m_full), (w_micro, m_micro) = finals
        for name in w_full:  # Adam's first steps move every weight by ~lr=1e-2; rounding moves a few by 1e-6
            torch.testing.assert_close(w_micro[name], w_full[name], atol=1e-4, rtol=0)
        for a, b in zip(m_full, m_micro):
            assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
            assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)


def test_gradient_checkpointing_changes_memory_not_math(tmp_path, tiny_path):
    runs = []
    for flag in (False, True):
        config = small_config(max_steps=2, gradient_checkpointing=flag, beta=0.04)
        train_grpo(config, tiny_path, ROWS, tmp_path / str(flag), reward_funcs=[digit_fraction], resume=False)
        runs.append(read_metrics(tmp_path / str(flag)))
    for a, b in zip(*runs):
        assert a["reward"] == b["reward"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)


def test_padding_free_changes_speed_not_math(tmp_path, tiny_path):
    """train_grpo with packed micro-batches (a token budget, gradient checkpointing: the backward recomputes the
    packed layers) == padded micro-batches: the same rollouts (the sampler generates with the swapped policy),
    losses, grad norms and weights after 2 steps with mu = 2 and a reference pass."""
    runs = []
    for name, packing in (("padded", {}), ("packed", dict(padding_free=True, max_tokens_per_batch=40,
                                                           gradient_checkpointing=True))):
        config = small_config(max_steps=2, beta=0.04, num_iterations=2, per_device_train_batch_size=5, **packing)
        train_grpo(config, tiny_path, ROWS, tmp_path / name, reward_funcs=[digit_fraction], resume=False)
        runs.append((load_file(tmp_path / name / "final" / "model.safetensors"), read_metrics(tmp_path / name)))
    (w_padded, m_padded), (w_packed, m_packed) = runs
    for a, b in zip(m_padded, m_packed, strict=True):
        assert a["reward"] == b["reward"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["kl"] == pytest.approx(b["kl"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    for name in w_padded:
        torch.testing.assert_close(w_packed[name], w_padded[name], atol=1e-4, rtol=0)


def test_shared_prompt_forward_changes_speed_not_math(tmp_path, tiny_path):
    """Each prompt run once for its G completions (policy, old and reference passes) == one pass per sequence,
    with micro-batches that split groups (5 of 16) and mu = 2 (old log-probs)."""
    runs = []
    for flag in (True, False):
        config = small_config(max_steps=2, share_prompt_forward=flag, beta=0.04, num_iterations=2,
                              per_device_train_batch_size=5)
        train_grpo(config, tiny_path, ROWS, tmp_path / str(flag), reward_funcs=[digit_fraction], resume=False)
        runs.append((load_file(tmp_path / str(flag) / "final" / "model.safetensors"), read_metrics(tmp_path / str(flag))))
    (w_shared, m_shared), (w_plain, m_plain) = runs
    for a, b in zip(m_shared, m_plain):
        assert a["reward"] == b["reward"]
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-6)
        assert a["kl"] == pytest.approx(b["kl"], abs=1e-6)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    for name in w_plain:
        torch.testing.assert_close(w_shared[name], w_plain[name], atol=1e-4, rtol=0)


def test_metrics_and_off_policy_iterations(tmp_path, tiny_path):
    config = small_config(max_steps=2, num_iterations=2, steps_per_generation=2, beta=0.04, temperature=0.9,
                          lr_scheduler_type="cosine", warmup_steps=1, report_to=["jsonl", "tensorboard"])
    train_grpo(config, tiny_path, ROWS, tmp_path, reward_funcs=[digit_fraction], resume=False)
    metrics = read_metrics(tmp_path)
    assert [m["step"] for m in metrics] == [1, 2]
    expected = {
        "reward", "reward_std", "rewards/digit_fraction/mean", "rewards/digit_fraction/std", "frac_reward_zero_std",
        "completions/mean_length", "completions/max_length", "completions/clipped_ratio", "kl", "entropy",
        "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean", "grad_norm", "learning_rate",
        "loss", "time/generate", "time/reward", "time/train", "time/reference", "tokens_per_second",
        "sampling/sampling_logp_difference/mean", "sampling/sampling_logp_difference/max",
        "completions/reflection_rate", "completions/mean_steps", "completions/backtrack_rate",
        "completions/direct_rate", "completions/count", "completions/accuracy",
    }
    assert expected <= set(metrics[0])
    # 4 optimiser steps per step; warmup 1 then cosine over 8: step 1 averages lr 0, 1.0, cos(1/7 pi)...
    assert metrics[0]["learning_rate"] < config.learning_rate
    assert 0.0 < metrics[0]["time/reference"] < metrics[0]["time/train"]  # beta > 0: the reference forward runs here
    # The backend's log-probs are the trainer's (same fp32 weights): float rounding only.
    assert metrics[0]["sampling/sampling_logp_difference/max"] < 1e-4
    # ... so the correction is skipped: no weights applied, none logged.
    assert not any(k.startswith("sampling/importance_sampling_ratio/") for k in metrics[0])
    assert metrics[1]["kl"] > 0.0  # the policy moved away from the reference
    assert math.isclose(metrics[0]["reward"], metrics[0]["rewards/digit_fraction/mean"], rel_tol=1e-6)
    assert metrics[0]["completions/count"] == config.generation_batch_size  # one source: no per-source keys
    assert "completions/checking_rate" not in metrics[0]  # no tries in these prompts
    assert list((tmp_path / "runs").glob("events.out.tfevents.*"))


def test_checkpoint_corruption_falls_back_to_the_previous_one(tmp_path, tiny_path, caplog):
    config = small_config(max_steps=4, save_steps=1, save_total_limit=3)
    train_grpo(config, tiny_path, ROWS, tmp_path, reward_funcs=[digit_fraction], resume=False)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [2, 3, 4]  # save_total_limit keeps the newest 3
    manifest = verify_checkpoint(tmp_path / "checkpoint-4")
    assert {"model.safetensors", "optimizer.pt", "trainer_state.json", "grpo_config.json"} <= set(manifest["files"])
    state = json.loads((tmp_path / "checkpoint-3" / "trainer_state.json").read_text())
    assert state["step"] == 3 and state["stream_position"] == 3 * config.prompts_per_step

    bad = tmp_path / "checkpoint-4" / "optimizer.pt"
    bad.write_bytes(bad.read_bytes()[:-10] + b"x" * 10)
    (tmp_path / "checkpoint-3" / "manifest.json").unlink()  # as if the process died before it was written
    with pytest.raises(CheckpointError, match="optimizer.pt is corrupt"):
        verify_checkpoint(tmp_path / "checkpoint-4")
    with caplog.at_level(logging.ERROR):
        loaded = load_latest_checkpoint(tmp_path, lambda p: torch.nn.Linear(1, 1))
    assert loaded.path.name == "checkpoint-2" and loaded.trainer_state["step"] == 2
    assert "checkpoint-4/optimizer.pt is corrupt" in caplog.text
    assert "checkpoint-3/manifest.json is missing" in caplog.text

    # Resuming continues from step 2: steps 3.. are run again, each appears once in metrics.jsonl.
    before = {m["step"]: m for m in read_metrics(tmp_path)}
    train_grpo(config.model_copy(update={"max_steps": 5}), tiny_path, ROWS, tmp_path, reward_funcs=[digit_fraction])
    after = read_metrics(tmp_path)
    assert [m["step"] for m in after] == [1, 2, 3, 4, 5]
    assert after[3]["loss"] == before[4]["loss"]  # the re-run step 4 is the same computation
    assert [s for s, _ in list_checkpoints(tmp_path)] == [3, 4, 5]

    # resume=False starts over: the old run's checkpoints must not outrank the new run's.
    train_grpo(config.model_copy(update={"max_steps": 2}), tiny_path, ROWS, tmp_path, reward_funcs=[digit_fraction], resume=False)
    assert [s for s, _ in list_checkpoints(tmp_path)] == [1, 2]
    assert [m["step"] for m in read_metrics(tmp_path)] == [1, 2]
    assert read_metrics(tmp_path)[1]["loss"] == before[2]["loss"]


def test_logging_steps_logs_every_nth_step_and_the_last(tmp_path, tiny_path):
    reported = []

    class Steps:
        def on_step(self, step, max_steps, metrics):
            reported.append(step)

    out = train_grpo(small_config(max_steps=3, logging_steps=2), tiny_path, ROWS, tmp_path,
                     reward_funcs=[digit_fraction], resume=False, callbacks=[Steps()])
    assert [m["step"] for m in read_metrics(tmp_path)] == reported == [2, 3]
    assert out["step"] == 3 and "reward" in out


def test_config_errors_say_how_to_fix_them(tiny_path, tmp_path):
    with pytest.raises(ValidationError, match="multiple of sampling.num_generations"):
        GRPOConfig(generation_batch_size=10, num_generations=4)
    with pytest.raises(ValidationError, match="one weight per reward function"):
        GRPOConfig(reward_funcs=["a", "b"], reward_weights=[1.0])
    with pytest.raises(ValidationError, match="extra"):
        GRPOConfig(num_generation=4)  # a typo is not silently ignored
    with pytest.raises(ValidationError, match=r"gradient_accumulation_steps \(2\) does nothing in GRPO.*"
                                              r"per_device_train_batch_size"):
        GRPOConfig(gradient_accumulation_steps=2)  # TRL's field, which would be ignored here
    with pytest.raises(KeyError, match="registered"):
        train_grpo(small_config(reward_funcs=["no_such_reward"]), tiny_path, ROWS, tmp_path)
    with pytest.raises(ValueError, match="one weight per function"):
        train_grpo(small_config(reward_weights=[1.0]), tiny_path, ROWS, tmp_path, reward_funcs=[digit_fraction, digit_fraction])
    with pytest.raises(ValueError, match="empty"):
        train_grpo(small_config(), tiny_path, [], tmp_path, reward_funcs=[digit_fraction])


def test_prompt_stream_and_seeds_are_deterministic(tiny_path):
    stream = PromptStream(5, seed=3)
    first_epoch = stream.rows_at(0, 5)
    assert sorted(first_epoch) == list(range(5))  # a permutation per epoch
    assert stream.rows_at(3, 4) == first_epoch[3:] + PromptStream(5, seed=3).rows_at(5, 2)
    assert PromptStream(5, seed=4).rows_at(0, 5) != first_epoch or PromptStream(5, seed=5).rows_at(0, 5) != first_epoch
    assert derive_seed(0, 1, 2, 3) == derive_seed(0, 1, 2, 3) != derive_seed(0, 1, 2, 4)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    ids = encode_prompt(tokenizer, [{"role": "user", "content": "7+8*3-5="}], max_prompt_length=32)
    assert ids[0] == tokenizer.bos_token_id and tokenizer.decode(ids[1:]) == "7+8*3-5="
    assert encode_prompt(tokenizer, "abcdef", max_prompt_length=3) == tokenizer("def", add_special_tokens=False)["input_ids"]


def _groups(positions: list[int], rewards: list[list[float]]) -> ScoredGroups:
    G = len(rewards[0])
    flat = [r for group in rewards for r in group]
    rollouts = [Rollout([p], [1], None, False, "") for p in positions for _ in range(G)]
    return ScoredGroups(positions, [{"prompt": str(p)} for p in positions], rollouts, torch.tensor(flat)[:, None],
                        [False] * len(positions))


def _combine(groups: ScoredGroups) -> torch.Tensor:
    return combine_rewards(groups.rewards_per_func)


def test_dynamic_sampling_drops_flat_groups_and_refills_with_a_cap():
    # Position p has rewards all equal when p is even.
    def generate(position: int, count: int) -> ScoredGroups:
        pos = list(range(position, position + count))
        return _groups(pos, [[1.0, 1.0] if p % 2 == 0 else [0.0, 1.0] for p in pos])

    config = GRPOConfig(generation_batch_size=8, num_generations=2, dynamic_sampling=True, max_dynamic_sampling_rounds=3)
    out = collect_step_groups(generate, 0, config, _combine)
    assert out.train.positions == [1, 3, 5, 7] and out.rounds == 2 and out.position == 8 and len(out.generated) == 8
    assert out.informative == 4 and out.short == [0]
    config = config.model_copy(update={"max_dynamic_sampling_rounds": 1})
    # Only one informative group per round of 4 when 3 of 4 are flat: the cap stops at 2 rounds.
    def sparse(position: int, count: int) -> ScoredGroups:
        pos = list(range(position, position + count))
        return _groups(pos, [[0.0, 1.0] if p % 4 == 1 else [0.0, 0.0] for p in pos])

    out = collect_step_groups(sparse, 0, config, _combine)
    assert out.train.positions == [1, 5] and out.rounds == 2 and out.position == 8 and out.short == [2]
    assert torch.equal(out.train.rewards_per_func[:, 0], torch.tensor([0.0, 1.0, 0.0, 1.0]))
    off = config.model_copy(update={"dynamic_sampling": False})
    out = collect_step_groups(sparse, 0, off, _combine)
    assert out.train.positions == [0, 1, 2, 3] and out.rounds == 1 and out.position == 4 and out.informative == 1


def test_mask_truncated_completions_removes_them_from_the_loss():
    from grpo_core.trainer.update import build_train_batch

    rollouts = [Rollout([5, 6], [7, 2], [0.0, 0.0], False, ""), Rollout([6], [7, 7, 7], [0.0] * 3, True, "")]
    batch = build_train_batch(rollouts, torch.tensor([1.0, -1.0]), pad_token_id=0, mask_truncated=True)
    assert batch.prompt_ids.tolist() == [[5, 6], [0, 6]] and batch.prompt_mask.tolist() == [[1, 1], [0, 1]]
    assert batch.completion_ids.tolist() == [[7, 2, 0], [7, 7, 7]]
    assert batch.completion_mask.tolist() == [[1, 1, 0], [1, 1, 1]]
    assert batch.loss_mask.tolist() == [[1, 1, 0], [0, 0, 0]]


def test_vllm_context_is_capped_at_the_model_positions():
    """max_prompt_length + max_completion_length past the model's positions: vLLM would refuse to start."""
    from types import SimpleNamespace

    from grpo_core.generation import backend_options

    config = small_config(max_prompt_length=256, max_completion_length=32)
    opts = backend_options(config.sampling, "vllm", torch.device("cpu"), seed=0,
                           model_config=SimpleNamespace(max_position_embeddings=256))
    assert opts["max_model_len"] == 256
    opts = backend_options(config.sampling, "vllm", torch.device("cpu"), seed=0,
                           model_config=SimpleNamespace(max_position_embeddings=4096))
    assert opts["max_model_len"] == 288


def test_reward_settings_reach_the_math_verifier(tmp_path, tiny_path):
    from grpo_core.rewards.math import DEFAULT_NUM_WORKERS, DEFAULT_TIMEOUT_S, configure

    try:
        config = small_config(max_steps=1, reward_timeout=1.5, reward_num_workers=1)
        train_grpo(config, tiny_path, ROWS, tmp_path / "run", reward_funcs=[digit_fraction], resume=False)
        settings = configure()
        assert settings["timeout"] == 1.5 and settings["num_workers"] == 1
    finally:
        configure(timeout=DEFAULT_TIMEOUT_S, num_workers=DEFAULT_NUM_WORKERS)


def test_second_iteration_clips_against_the_old_log_probs(tmp_path, tiny_path):
    """mu = 2 with a large step: the second pass sees ratios pi/pi_old far from 1, so the clip binds.

    Guards the old log-probs branch in trainer/update.py: with on-policy log-probs in their place
    (ratio 1 on every pass) clip_ratio/region_mean stays exactly 0 and this test fails (checked by mutation).
    """
    config = small_config(max_steps=2, num_iterations=2, learning_rate=0.1, epsilon=0.05)
    train_grpo(config, tiny_path, ROWS, tmp_path, reward_funcs=[digit_fraction], resume=False)
    metrics = read_metrics(tmp_path)
    # Averaged over both passes; the first pass has ratio 1, the second moved by Adam's first step of ~lr.
    assert all(m["clip_ratio/region_mean"] > 0.01 for m in metrics), [m["clip_ratio/region_mean"] for m in metrics]
