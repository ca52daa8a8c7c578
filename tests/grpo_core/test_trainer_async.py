"""One-step-off asynchronous rollouts: the schedule, its metrics, and exact resume from a checkpoint."""

from __future__ import annotations

import pytest
import torch

from grpo_core.config import GRPOConfig
from grpo_core.generation.base import GenerationRequest
from grpo_core.models.tiny import build_tiny_model
from grpo_core.trainer.loop import train_grpo
from tests.grpo_core.run_helpers import assert_same_final_weights, read_metrics

torch.set_num_threads(1)

ROWS = [{"prompt": [{"role": "user", "content": f"{i}+{i}="}], "answer": str(2 * i)} for i in range(20)]


def digit_fraction(completions, **kwargs):
    texts = [c[0]["content"] for c in completions]
    return [sum(ch.isdigit() for ch in t) / max(1, len(t)) for t in texts]


def async_config(**overrides) -> GRPOConfig:
    fields = dict(
        use_vllm=False, async_rollouts=True, async_sampler_timeout=300, max_steps=4, generation_batch_size=8,
        num_generations=4, max_completion_length=6, max_prompt_length=32, per_device_train_batch_size=8,
        learning_rate=1e-2, beta=0.0, save_steps=2, report_to=["jsonl"], seed=3,
    )
    fields.update(overrides)
    return GRPOConfig(**fields)


class CrashAt:
    """Raises after ``step`` is logged (its checkpoint, if any, is written after this callback)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step(self, step: int, max_steps: int, metrics: dict) -> None:
        if step == self.step:
            raise RuntimeError(f"crash at step {step}")


def assert_crash_and_resume_repeat(config: GRPOConfig, tiny_path, tmp_path) -> None:
    """A run crashed after step 3 and resumed from its step-2 checkpoint repeats the uninterrupted run in
    ``tmp_path/full``: the same rewards and losses, the same final weights bit for bit."""
    with pytest.raises(RuntimeError, match="crash at step 3"):
        train_grpo(config, tiny_path, ROWS, tmp_path / "crash", reward_funcs=[digit_fraction], resume=False,
                   callbacks=[CrashAt(3)])
    train_grpo(config, tiny_path, ROWS, tmp_path / "crash", reward_funcs=[digit_fraction], resume=True)
    metrics, resumed = read_metrics(tmp_path / "full"), read_metrics(tmp_path / "crash")
    assert [m["reward"] for m in resumed] == [m["reward"] for m in metrics]
    assert [m["loss"] for m in resumed] == [m["loss"] for m in metrics]
    assert_same_final_weights(tmp_path / "full", tmp_path / "crash")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden_size=32, num_layers=2, num_heads=2)


@pytest.mark.slow
def test_async_rollouts_are_one_step_stale_corrected_and_resume_exactly(tmp_path, tiny_path):
    config = async_config(beta=0.04)  # the reference log-probs come from the sampler and ride in the checkpoint
    train_grpo(config, tiny_path, ROWS, tmp_path / "full", reward_funcs=[digit_fraction], resume=False)
    metrics = read_metrics(tmp_path / "full")
    assert [m["async/staleness"] for m in metrics] == [0.0, 1.0, 1.0, 1.0]
    for m in metrics:  # the sampler process is not the trainer's forward: the correction acts and is logged
        assert 0.0 < m["sampling/importance_sampling_ratio/min"] <= m["sampling/importance_sampling_ratio/max"] <= 2.0
        assert m["time/reference"] == 0.0  # the trainer runs no reference forward: the sampler process does
    # step 1 samples the trainer's own weights (float rounding only); later steps sample the previous weights
    assert metrics[0]["sampling/sampling_logp_difference/max"] < 1e-4
    assert metrics[2]["sampling/sampling_logp_difference/max"] > 1e-3

    # a crash after step 3 (checkpoint at 2), then a resume: the same rollouts, the same weights, bit for bit
    assert_crash_and_resume_repeat(config, tiny_path, tmp_path)


@pytest.fixture(scope="module")
def bf16_path(tiny_path, tmp_path_factory):
    """A "hub model": the tiny model saved in bf16 (config.json names bfloat16)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tmp_path_factory.mktemp("tiny-bf16")
    AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.bfloat16).save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_path).save_pretrained(path)
    return path


class NoTempFiles:
    """Fails a step if a regular file lies under ``folder`` (the temporary folder of the trainer and sampler)."""

    def __init__(self, folder) -> None:
        self.folder = folder

    def on_step(self, step: int, max_steps: int, metrics: dict) -> None:
        files = [p for p in self.folder.rglob("*") if p.is_file()]  # multiprocessing's sockets are no files
        assert not files, f"step {step}: the async run wrote {files} under the temporary folder"


def test_bf16_base_samples_in_the_trainers_dtype_without_temp_files_and_resumes_exactly(tmp_path, bf16_path,
                                                                                       private_tmpdir):
    """A bf16 checkpoint samples in the trainer's fp32 (so the sampler's log-probs at step 1 are the trainer's), the
    weights reach the sampler without a file under the temporary folder, and a crash and resume repeat the run
    bit for bit (the resumed sampler starts from an fp32 checkpoint: it must sample as the bf16 base's did)."""
    tmp = private_tmpdir  # the sampler process's and the trainer's temporary folder
    config = async_config()
    train_grpo(config, bf16_path, ROWS, tmp_path / "full", reward_funcs=[digit_fraction], resume=False,
               callbacks=[NoTempFiles(tmp)])
    metrics = read_metrics(tmp_path / "full")
    assert metrics[0]["sampling/sampling_logp_difference/max"] < 1e-4  # fp32 beside fp32 (a bf16 sampler: ~1e-3)
    assert_crash_and_resume_repeat(config, bf16_path, tmp_path)


def test_sampler_placement_follows_the_trainer_unless_configured():
    from grpo_core.trainer.async_rollouts import sampler_placement

    cuda = torch.device("cuda", 0)
    assert sampler_placement(async_config(), torch.float32, cuda) == (torch.float32, cuda)
    assert sampler_placement(async_config(), torch.float32, torch.device("cpu")) == (torch.float32, torch.device("cpu"))
    configured = async_config(async_sampler_dtype="bfloat16", async_sampler_device="cuda:1")
    assert sampler_placement(configured, torch.float32, cuda) == (torch.bfloat16, torch.device("cuda", 1))


@pytest.mark.parametrize("staleness", [1, 2])
def test_async_rollouts_keep_dynamic_sampling(tmp_path, tiny_path, staleness):
    config = async_config(max_steps=staleness + 1, dynamic_sampling=True, max_dynamic_sampling_rounds=2,
                          save_steps=100, async_max_staleness=staleness)
    train_grpo(config, tiny_path, ROWS, tmp_path, reward_funcs=[digit_fraction], resume=False)
    metrics = read_metrics(tmp_path)
    assert [m["async/staleness"] for m in metrics] == [float(k) for k in range(staleness + 1)]
    assert all(m["dynamic_sampling/rounds"] >= 1 for m in metrics)


def test_sampler_reference_logps_equal_the_trainers(tiny_path):
    """The sampler scores each round with its own padding; the trainer would score the step's batch with another
    (and other micro-batches): the values agree to float rounding."""
    from transformers import AutoTokenizer

    from grpo_core.generation import make_backend
    from grpo_core.trainer.async_rollouts import ReferenceLogps
    from grpo_core.trainer.skeleton import load_model
    from grpo_core.trainer.update import build_train_batch, compute_batch_logps

    config = async_config(beta=0.04, per_device_train_batch_size=3, max_completion_length=8)
    tokenizer = AutoTokenizer.from_pretrained(tiny_path)
    model = load_model(tiny_path, torch.device("cpu")).eval()
    backend = make_backend("hf", str(tiny_path), model=model, tokenizer=tokenizer)
    prompts = [tokenizer(text)["input_ids"] for text in ("1+1=", "12+345=", "6*7=", "1234+5678-9=")]
    sample = dict(n=3, temperature=1.0, top_p=1.0, top_k=0)  # a round's completions: 8 tokens, then 5 (a random
    # model rarely stops)
    rounds = [backend.generate(prompts[:2], GenerationRequest(max_tokens=8, seeds=[1, 2, 3, 4, 5, 6], **sample)),
              backend.generate(prompts[2:], GenerationRequest(max_tokens=5, seeds=[7, 8, 9, 10, 11, 12], **sample))]
    reference = ReferenceLogps(str(tiny_path), config, tokenizer.pad_token_id or tokenizer.eos_token_id)
    reference.load()
    rollouts = [r for part in rounds for r in reference(part)]
    for lengths in ({len(r.prompt_ids) for r in rollouts}, {len(r.completion_ids) for r in rollouts}):
        assert len(lengths) > 1, "the test needs prompts and completions of different lengths (other padding)"

    batch = build_train_batch(rollouts, torch.zeros(len(rollouts)), tokenizer.eos_token_id, mask_truncated=False)
    trainer = compute_batch_logps(model, batch, list(range(len(rollouts))), config.model_copy(
        update={"per_device_train_batch_size": 5}), torch.device("cpu"))  # [N, Tc]
    assert batch.ref_logps is not None  # taken from the rollouts: the trainer would run no reference forward
    mask = batch.completion_mask.bool()
    assert torch.allclose(batch.ref_logps[mask], trainer[mask], atol=1e-5, rtol=0)
    assert float(batch.ref_logps[mask].abs().min()) > 0  # real log-probs, not the padding's zeros


@pytest.mark.extended
@pytest.mark.slow
def test_reference_on_the_sampler_gives_the_trainers_kl_and_loss(tmp_path, tiny_path):
    runs = {}
    for on_sampler in (True, False):
        config = async_config(beta=0.04, max_steps=3, save_steps=100, async_reference_on_sampler=on_sampler)
        train_grpo(config, tiny_path, ROWS, tmp_path / str(on_sampler), reward_funcs=[digit_fraction], resume=False)
        runs[on_sampler] = read_metrics(tmp_path / str(on_sampler))
    for sampler, trainer in zip(runs[True], runs[False]):
        assert sampler["kl"] > 0 and trainer["kl"] > 0 or sampler["step"] == 1  # step 1: policy == reference
        assert sampler["kl"] == pytest.approx(trainer["kl"], rel=1e-4, abs=1e-9)
        assert sampler["loss"] == pytest.approx(trainer["loss"], rel=1e-4, abs=1e-7)
        assert sampler["reward"] == trainer["reward"]


@pytest.mark.extended
@pytest.mark.slow
def test_two_steps_of_staleness_are_logged_and_resume_exactly(tmp_path, tiny_path):
    """async_max_staleness 2: step n trains on rollouts of the weights of step n-3; a checkpoint collects every
    round in flight, so a crash and resume give the same rollouts and the same weights, bit for bit."""
    config = async_config(beta=0.04, async_max_staleness=2, max_steps=5, save_steps=2)
    train_grpo(config, tiny_path, ROWS, tmp_path / "full", reward_funcs=[digit_fraction], resume=False)
    metrics = read_metrics(tmp_path / "full")
    assert [m["async/staleness"] for m in metrics] == [0.0, 1.0, 2.0, 2.0, 2.0]
    one_step = async_config(beta=0.04, max_steps=5, save_steps=100)
    train_grpo(one_step, tiny_path, ROWS, tmp_path / "k1", reward_funcs=[digit_fraction], resume=False)
    k1 = read_metrics(tmp_path / "k1")
    gap = "sampling/sampling_logp_difference/mean"  # the sampler's log-probs against the trainer's
    assert [m[gap] for m in metrics[:2]] == [m[gap] for m in k1[:2]]  # the same rollouts and weights so far
    assert metrics[2][gap] != k1[2][gap]  # step 3: sampled by the weights of step 0 (k=2), of step 1 (k=1)

    assert_crash_and_resume_repeat(config, tiny_path, tmp_path)
