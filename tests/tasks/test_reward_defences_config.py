"""The reward-hacking defences in a YAML config: the embedded default with each one switched on parses, and a bad
value fails at load naming the file, line and field with the fix (a reward spec's field by the path the user wrote,
``...reward_funcs.0.reward_model.FIELD``, not pydantic's union branches)."""

from __future__ import annotations

import pytest

from tasks.config.pipeline import DEFAULT_CONFIG, ConfigError, load_config

HELPFUL = "{reward_model: {model: reward_model, name: rm_helpful, scope: full}}"
NEAR_MISS = "  near_miss_negatives: 2            #"


def with_defences(helpful: str = HELPFUL, near_miss: str = "2") -> str:
    """The embedded default (which trains its reward model with near misses) with the helpful source's reward
    spec and ``reward_model.near_miss_negatives`` replaced."""
    text = DEFAULT_CONFIG.read_text()
    assert HELPFUL in text and NEAR_MISS in text
    return text.replace(HELPFUL, helpful).replace(NEAR_MISS, f"  near_miss_negatives: {near_miss}  #", 1)


def test_the_default_with_the_defences_on_parses(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text(with_defences(HELPFUL.replace("}}", ", normalize: true, reward_clip_range: [-3.0, 3.0]}}")))
    config = load_config(path)
    assert config.reward_model.near_miss_negatives == 2
    (entry,) = config.final_rl.sources[1].reward_funcs
    assert entry.reward_clip_range == (-3.0, 3.0) and entry.normalize


@pytest.mark.parametrize("helpful,near_miss,expect", [
    (HELPFUL, "-1", r"d.yaml:\d+: reward_model.near_miss_negatives: Input should be greater than or equal to 0"),
    (HELPFUL.replace("}}", ", reward_clip_range: [1, -1]}}"), "0",
     r"^\S*d.yaml:\d+: final_rl.sources.1.reward_funcs.0.reward_model.reward_clip_range: Value error, "
     r"reward_clip_range must be \[lo, hi\] with finite lo < hi, got \[1.0, -1.0\]; e.g. \[-3.0, 3.0\]"),
    (HELPFUL.replace("full", "bogus"), "0",  # any field of a spec: its own path, not pydantic's union branches
     r"^\S*d.yaml:\d+: final_rl.sources.1.reward_funcs.0.reward_model.scope: Input should be 'summary' or 'full' "
     r"\(got 'bogus'\)$"),
    (HELPFUL.replace("}}", ", ensemble: [/no/such/rm], normalize: true}}"), "0",
     r"d.yaml:\d+: final_rl.sources.1.reward_funcs.0.*ensemble\[0\] '/no/such/rm': no such folder"),
    (HELPFUL.replace("}}", ", ensemble: [/no/such/rm]}}"), "0", r"ensemble: set normalize: true"),
])
def test_a_bad_defence_fails_at_load_naming_the_field(tmp_path, helpful, near_miss, expect):
    path = tmp_path / "d.yaml"
    path.write_text(with_defences(helpful, near_miss))
    with pytest.raises(ConfigError, match=expect) as e:
        load_config(path)
    assert "tagged-union" not in str(e.value) and "valid string" not in str(e.value)  # a mapping is no name


def test_the_memory_plan_loads_every_ensemble_member():
    from grpo_core.config import GRPOConfig
    from tasks.config.plan import section_scorers

    section = GRPOConfig(generation_batch_size=16, reward_funcs=[
        {"reward_model": {"model": "/rm/a", "ensemble": ["/rm/b", "/rm/c"], "normalize": True, "name": "rm"}}])
    scorers = section_scorers(section, "grpo", lambda model: model)  # the "shape" is the model it was asked for
    assert [(s.name, s.shape) for s in scorers] == [("rm", "/rm/a"), ("rm", "/rm/b"), ("rm", "/rm/c")]


def test_the_run_s_own_reward_model_on_summaries_is_warned_about(tmp_path, recwarn):
    """The reward_model stage learns the built-in pairs as whole responses; scored on the summary alone its helpful
    score went flat and final RL refused helpful prompts (issue 28). The default scores whole responses: no warning;
    ``scope: summary`` on the run's own model: a warning naming the file, line and field with the fix."""
    load_config(DEFAULT_CONFIG)
    assert not [w for w in recwarn if issubclass(w.category, UserWarning)]
    path = tmp_path / "d.yaml"
    path.write_text(with_defences(HELPFUL.replace("full", "summary")))
    with pytest.warns(UserWarning, match=r"d.yaml:\d+: final_rl.sources.1.reward_funcs.0.reward_model.scope: summary "
                                         r"scores only the text after </think>.*use scope: full"):
        load_config(path)
    hub = HELPFUL.replace("reward_model, name", "org/some-rm, name").replace("full", "summary")  # not the run's own
    path.write_text(with_defences(hub))
    recwarn.clear()
    load_config(path)
    assert not [w for w in recwarn if "scope" in str(w.message)]
