"""A data mixture that cannot be right fails at config validation: one error line naming the field and the fix,
before Prefect or the store are touched (nothing committed)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from flows.cli import app

BASE = """model: {tiny: {hidden_size: 16, num_layers: 1, num_heads: 2}}
data: {builtin_task: chain, builtin_general: [helpful, unsafe], num_train: 50, num_eval: 10}
final_rl:
  sources:
    - {name: chain, weight: 1.0, reward_funcs: [chain_accuracy]}
    - SECOND
"""


@pytest.fixture
def no_pipeline(monkeypatch):
    import flows.r1_pipeline

    def started(*_, **__):
        raise AssertionError("the pipeline started")

    monkeypatch.setattr(flows.r1_pipeline, "r1_pipeline", started)


@pytest.mark.parametrize("second, message", [
    ("{name: helpful, weight: 0, reward_funcs: [preference_rule]}",
     "final_rl.sources.1: Value error, source 'helpful' has weight 0.0; a weight is the source's share of each "
     "step's prompts and must be > 0 (remove the source to leave it out)"),
    ("{name: helpful, weight: -0.5, reward_funcs: [preference_rule]}", "source 'helpful' has weight -0.5;"),
    ("{name: helpful, weight: 1.0}", "final_rl.sources.1: Value error, source 'helpful' has no reward function; "
     "give it reward_funcs: [...]"),
    ("{name: helpful, weight: 1.0, reward_funcs: []}", "source 'helpful' has no reward function"),
    ("{name: helpful, weight: 1.0, reward_funcs: [no_such_reward]}",
     "final_rl.sources.1.reward_funcs.0: unknown reward function 'no_such_reward'"),
    ("{name: chain, weight: 1.0, reward_funcs: [chain_format]}", "sources names a source twice"),
])
def test_bad_mixture_fails_at_config_validation(tmp_path, no_pipeline, second, message):
    cfg = tmp_path / "mix.yaml"
    cfg.write_text(BASE.replace("SECOND", second))
    store = tmp_path / "store"
    result = CliRunner().invoke(app, ["run", "-c", str(cfg), "--run", "mix", "--store", str(store)])
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0], result.output
    assert f"{cfg}:" in lines[0]  # names the file (and the line)
    assert not store.exists() or not any(store.rglob("*"))  # nothing written, nothing committed


def test_sources_and_top_level_reward_funcs_together_are_refused(tmp_path, no_pipeline):
    cfg = tmp_path / "mix.yaml"
    cfg.write_text(BASE.replace("SECOND", "{name: helpful, weight: 1.0, reward_funcs: [preference_rule]}")
                   + "  reward_funcs: [chain_accuracy]\n")
    result = CliRunner().invoke(app, ["run", "-c", str(cfg), "--run", "mix", "--store", str(tmp_path / "s")])
    assert result.exit_code == 1 and "final_rl: with sources, each source names its own reward_funcs" in result.output


def test_a_saved_mixture_config_loads_again():
    """What a run saves (every field written out, reward_funcs' default included) is what `r1 stage` and
    `r1 eval` read back: a config with sources must round-trip."""
    from tasks.config.pipeline import DEFAULT_CONFIG, PipelineConfig, load_config

    config = load_config(DEFAULT_CONFIG)
    assert config.final_rl.sources  # the embedded default mixes sources in final RL
    assert PipelineConfig.model_validate(config.model_dump(mode="json")) == config
