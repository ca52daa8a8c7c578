"""The optional reward_model stage: it trains on prepare_data's ``preferences.parquet`` and commits a model with
held-out pair accuracy; a GRPO stage names it as a reward by stage reference (an input of that stage, resolved
to the fetched folder) or by path; the stage table, status and config validation respect that it is optional;
bad input fails fast with one message and commits nothing."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from flows.run_status import stage_status
from flows.stages import RUN_CONFIG
from grpo_core.data.rows import write_parquet
from grpo_core.models.tiny import build_tiny_model
from grpo_core.rewards.reward_model import RewardModelReward
from grpo_core.rewards.scoring import resolve_reward
from tasks.config.pipeline import ConfigError, PipelineConfig, load_config, parse_config
from tasks.config.stages import get_stage
from tasks.runner.common import StageContext, StageFailed, resolve_reward_models
from tasks.storage.store import Store

GOOD = "Sure. Step 1: gather what you need. Step 2: follow the steps. Thanks for asking!"


def preference_rows(n: int) -> list[dict]:
    rng = random.Random(0)
    rows = []
    for i in range(n):
        q = f"How do I {rng.choice(['cook', 'paint', 'fix', 'clean'])} a {rng.choice(['car', 'bike', 'lamp'])}?"
        rows.append({"prompt": [{"role": "user", "content": q}], "chosen": GOOD, "rejected": "No.",
                     "source": "helpful" if i % 2 else "unsafe"})
    return rows


def config(**sections) -> PipelineConfig:
    return PipelineConfig.model_validate({
        "model": {"tiny": {"hidden_size": 32, "num_layers": 1, "num_heads": 2}},
        "run": {"isolation": "inline"},
        "reward_model": {"max_steps": 16, "per_device_train_batch_size": 8, "learning_rate": 1e-3, "max_length": 128,
                         "report_to": ["jsonl"]},
        **sections,
    })


def commit_prepare_data(store: Store, run: str, tmp: Path, with_preferences: bool = True, rows: list | None = None):
    """A prepare_data output as the stage writes it: the tiny base model and (optionally) the preference pairs."""
    out = tmp / f"prep-{with_preferences}"
    build_tiny_model(out / "base_model", hidden_size=32, num_layers=1, num_heads=2)
    if with_preferences:
        write_parquet(rows or preference_rows(120), out / "preferences.parquet")
    with store.begin(run, "prepare_data") as writer:
        writer.put_dir(out)
        return writer.commit(fingerprint=f"test-{with_preferences}", config={}, parents={}, metrics={})


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rm_stage")
    store = Store(tmp / "store")
    data = commit_prepare_data(store, "r", tmp)
    ref = get_stage("reward_model").task.fn(config(), "r", str(tmp / "store"), {"prepare_data": data})
    return tmp, store, data, ref


def test_stage_trains_and_commits_model_and_pair_accuracy(trained):
    _, store, _, ref = trained
    assert ref.stage == "reward_model"
    assert ref.metrics["eval/pair_accuracy"] >= 0.9
    assert ref.metrics["eval/num_pairs"] == 12  # eval_fraction 0.1 of 120
    assert {"eval/helpful/pair_accuracy", "eval/unsafe/pair_accuracy", "train/loss"} <= set(ref.metrics)
    files = store.manifest(ref)["files"]
    assert {"model/config.json", "model/model.safetensors", "model/reward_stats.json", "metrics.jsonl"} <= set(files)
    assert store.manifest(ref)["config"]["reward_model"]["max_steps"] == 16
    assert store.manifest(ref)["config"]["reward_model"]["min_heldout_accuracy"] == 0.9  # the default gate passed


def test_low_heldout_accuracy_fails_the_stage_naming_the_source_and_commits_nothing(tmp_path):
    # the unsafe pairs' two responses are the same text: no model ranks them, so their held-out accuracy is 0
    rows = [{**r, "rejected": r["chosen"]} if r["source"] == "unsafe" else r for r in preference_rows(120)]
    store = Store(tmp_path / "store")
    data = commit_prepare_data(store, "weak", tmp_path, rows=rows)
    task = get_stage("reward_model").task.fn
    with pytest.raises(StageFailed) as err:
        task(config(), "weak", str(tmp_path / "store"), {"prepare_data": data})
    msg = str(err.value)
    # the pairs that fail, each once: all pairs (half of them unrankable) and the unsafe source's, not the helpful
    assert re.search(r"below reward_model.min_heldout_accuracy \(0.9\): all pairs 0\.\d\d, unsafe pairs 0\.00 \(", msg)
    assert "reward_model.max_steps, now 16" in msg and "Nothing was committed" in msg
    assert store.latest("weak", "reward_model") is None  # final RL has no reward model to start from
    # the user's way out, as the message says: a lower bar (here: none) commits the same model
    lenient = config()
    lenient.reward_model.min_heldout_accuracy = None
    ref = task(lenient, "weak", str(tmp_path / "store"), {"prepare_data": data})
    assert ref.metrics["eval/unsafe/pair_accuracy"] == 0.0 and ref.metrics["eval/helpful/pair_accuracy"] == 1.0


def test_final_rl_names_the_stage_output_as_a_reward(trained):
    tmp, store, data, ref = trained
    cfg = config(final_rl={"reward_funcs": ["format", {"reward_model": {"model": "reward_model", "scope": "full"}}],
                           "generation_batch_size": 16})
    assert get_stage("final_rl").inputs(cfg) == ("prepare_data", "sft_consolidate", "reward_model")
    assert get_stage("grpo_train").inputs(cfg) == ("prepare_data", "cold_start_sft")  # it names no reward model
    ctx = StageContext.open(cfg, "r", str(tmp / "store"), "final_rl")
    try:
        resolved = resolve_reward_models(ctx, cfg.final_rl, {"prepare_data": data, "reward_model": ref})
        local = resolved.reward_funcs[1].model
        assert Path(local, "config.json").is_file() and cfg.final_rl.reward_funcs[1].model == "reward_model"
        fn, name = resolve_reward(resolved.reward_funcs[1])
        assert name == "reward_model" and isinstance(fn, RewardModelReward)
        prompt = preference_rows(1)[0]["prompt"]
        good, bad = fn(prompts=[prompt, prompt], completions=[GOOD, "No."])
        assert good > bad
        with pytest.raises(StageFailed, match="not among this stage's inputs"):
            resolve_reward_models(ctx, cfg.final_rl, {"prepare_data": data})
    finally:
        ctx.cleanup()


def test_reward_model_by_path(trained, tmp_path):
    tmp, store, _, ref = trained
    folder = store.get_output(ref, "model", tmp_path / "rm")
    cfg = config(final_rl={"reward_funcs": [{"reward_model": {"model": str(folder)}}], "generation_batch_size": 16})
    assert get_stage("final_rl").inputs(cfg) == ("prepare_data", "sft_consolidate")  # a path is no stage input
    fn, _ = resolve_reward(cfg.final_rl.reward_funcs[0])
    assert len(fn(prompts=["q"], completions=["a"])) == 1


def test_optional_stage_is_skipped_without_its_section(tmp_path):
    plain = PipelineConfig()
    assert not get_stage("reward_model").enabled(plain) and get_stage("reward_model").enabled(config())
    store = Store(tmp_path / "store")
    store.write_run_file("off", RUN_CONFIG, {"config": plain.model_dump(mode="json")})
    store.write_run_file("on", RUN_CONFIG, {"config": config().model_dump(mode="json")})
    assert stage_status(store, "off")["stages"]["reward_model"]["state"] == "skipped"
    assert stage_status(store, "on")["stages"]["reward_model"]["state"] == "pending"
    assert stage_status(store, "off")["stages"]["grpo_train"]["state"] == "pending"


def test_stage_reference_without_the_stage_fails_at_config_load(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("final_rl:\n  reward_funcs:\n    - format\n    - reward_model: {model: reward_model}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:4: final_rl.reward_funcs.1: model: reward_model names the "
                                          r"reward_model stage, which this config does not run"):
        load_config(path)


def test_causal_lm_path_fails_at_config_load_with_one_message(tmp_path):
    base = build_tiny_model(tmp_path / "lm", hidden_size=16, num_layers=1, num_heads=2)
    with pytest.raises(ConfigError) as err:
        parse_config({"final_rl": {"reward_funcs": [{"reward_model": {"model": str(base)}}]}}, "c.yaml")
    msg = str(err.value)
    assert msg.count("\n") == 0 and "final_rl.reward_funcs.0" in msg
    assert "LlamaForCausalLM" in msg and "not a ...ForSequenceClassification model" in msg


def test_no_preference_pairs_fails_fast_and_commits_nothing(tmp_path):
    store = Store(tmp_path / "store")
    data = commit_prepare_data(store, "bad", tmp_path, with_preferences=False)
    with pytest.raises(StageFailed, match=r"has no preferences.parquet; the reward model needs preference pairs"):
        get_stage("reward_model").task.fn(config(), "bad", str(tmp_path / "store"), {"prepare_data": data})
    assert store.latest("bad", "reward_model") is None and store.uncommitted("bad", "reward_model") == []


def test_a_stage_reference_counts_wherever_it_sits_in_a_section(trained):
    # e.g. a mixture source's reward_funcs, or an evaluation's reward-model field: the helpers walk the section.
    from pydantic import BaseModel

    from grpo_core.config import RewardEntry
    from tasks.config.sections import reward_model_upstream

    class Source(BaseModel):
        name: str
        reward_funcs: list[RewardEntry]

    class Section(BaseModel):
        sources: list[Source]
        rm_reward: RewardEntry | None = None

    plain = Section(sources=[Source(name="chain", reward_funcs=["format"])])
    nested = Section(sources=[Source(name="chain", reward_funcs=["format"]),
                              Source(name="helpful", reward_funcs=[{"type": "reward_model", "model": "reward_model"}])],
                     rm_reward={"type": "reward_model", "model": "reward_model", "name": "rm_eval"})
    assert reward_model_upstream(plain) == () and reward_model_upstream(nested) == ("reward_model",)
    tmp, store, data, ref = trained
    ctx = StageContext.open(config(), "r", str(tmp / "store"), "final_rl")
    try:
        resolved = resolve_reward_models(ctx, nested, {"reward_model": ref})
        assert Path(resolved.sources[1].reward_funcs[0].model, "config.json").is_file()
        assert resolved.rm_reward.model == resolved.sources[1].reward_funcs[0].model and resolved.rm_reward.name == "rm_eval"
        assert resolved.sources[0].reward_funcs == ["format"] and nested.sources[1].reward_funcs[0].model == "reward_model"
    finally:
        ctx.cleanup()


def test_cli_run_with_a_causal_lm_as_reward_model_is_one_line_and_writes_nothing(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import flows.r1_pipeline
    from flows.cli import app

    def started(**_):
        raise AssertionError("the pipeline started")

    monkeypatch.setattr(flows.r1_pipeline, "r1_pipeline", started)
    base = build_tiny_model(tmp_path / "lm", hidden_size=16, num_layers=1, num_heads=2)
    path = tmp_path / "bad.yaml"
    path.write_text(f"model: {{tiny: {{}}}}\nfinal_rl:\n  reward_funcs:\n    - reward_model: {{model: {base}}}\n")
    result = CliRunner().invoke(app, ["run", "-c", str(path), "--store", str(tmp_path / "store"), "--run", "bad"])
    assert result.exit_code == 1
    (line,) = result.output.strip().splitlines()
    assert line.startswith(f"error: {path}:4: final_rl.reward_funcs.0: reward model {base}: its config.json names "
                           "['LlamaForCausalLM'], not a ...ForSequenceClassification model")
    assert not (tmp_path / "store").exists()


def test_rejection_sample_names_the_stage_output_in_a_source_rule(trained, tmp_path):
    tmp, store, data, ref = trained
    rules = [{"name": "chain", "reward_func": "chain_accuracy"},
             {"name": "helpful", "reward_func": {"reward_model": {"model": "reward_model", "scope": "summary"}},
              "min_score": 0.0, "keep_per_prompt": 1}]
    cfg = config(rejection_sample={"sources": rules})
    assert get_stage("rejection_sample").inputs(cfg) == ("prepare_data", "grpo_train", "reward_model")
    assert get_stage("rejection_sample").inputs(config()) == ("prepare_data", "grpo_train")
    ctx = StageContext.open(cfg, "r", str(tmp / "store"), "rejection_sample")
    try:
        resolved = resolve_reward_models(ctx, cfg.rejection_sample, {"prepare_data": data, "reward_model": ref})
        assert Path(resolved.sources[1].reward_func.model, "config.json").is_file()
        assert resolved.sources[0].reward_func == "chain_accuracy" and cfg.rejection_sample.sources[1].reward_func.model == "reward_model"
    finally:
        ctx.cleanup()
    path = tmp_path / "c.yaml"  # no reward_model section: the rule's line and field, before anything runs
    path.write_text("rejection_sample:\n  sources:\n    - {name: chain, reward_func: chain_accuracy}\n"
                    "    - {name: helpful, reward_func: {reward_model: {model: reward_model}}, min_score: 0.0}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:4: rejection_sample.sources.1.reward_func: model: reward_model "
                                          r"names the reward_model stage, which this config does not run"):
        load_config(path)
    path.write_text("rejection_sample:\n  sources:\n    - {name: chain, reward_func: chain_acuracy}\n")
    with pytest.raises(ConfigError, match=r"c.yaml:3: rejection_sample.sources.0.reward_func: unknown reward function"):
        load_config(path)


def test_r1_check_runs_the_gate_at_zero():
    # `r1 check` trains the reward model 2 steps on stand-ins: its accuracy is chance, so the gate cannot apply
    from tasks.check import miniature_pipeline

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml")
    assert cfg.reward_model.min_heldout_accuracy == 0.9
    mini = miniature_pipeline(cfg, build_model=lambda name: name, steps=2)
    assert mini.reward_model.max_steps == 2 and mini.reward_model.min_heldout_accuracy == 0.0
