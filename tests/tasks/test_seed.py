"""``PipelineConfig.with_seed`` (``r1 run --seed N``): every ``seed`` field of the config takes N, nothing else
changes, and each stage's fingerprint changes with it (no committed output of another seed is reused)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tasks.config.pipeline import DEFAULT_CONFIG, SEEDED_SECTIONS, load_config, parse_config
from tasks.runner.common import fingerprint

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))


def seed_fields(dump: Any, path: str = "") -> dict[str, Any]:
    """Every key named ``seed`` in a config dump, found by walking it (not by ``PipelineConfig.seeds``)."""
    out: dict[str, Any] = {}
    if isinstance(dump, dict):
        for key, value in dump.items():
            here = f"{path}.{key}" if path else str(key)
            out.update({here: value} if key == "seed" else seed_fields(value, here))
    elif isinstance(dump, list):
        for i, value in enumerate(dump):
            out.update(seed_fields(value, f"{path}.{i}"))
    return out


def with_teacher() -> Any:
    """The embedded default plus a teacher cold-start source (a seed inside a list of the data section)."""
    data = load_config().model_dump(mode="json")
    data["data"]["cold_start_sources"] = [{"kind": "teacher", "model": "/models/teacher", "seed": 7}]
    return parse_config(data)


@pytest.mark.parametrize("config", [*CONFIGS, "teacher"], ids=lambda c: getattr(c, "name", c))
def test_with_seed_sets_every_seed_field_and_nothing_else(config):
    cfg = with_teacher() if config == "teacher" else load_config(config)
    before = cfg.model_dump(mode="json")
    seeded = cfg.with_seed(3)
    dump = seeded.model_dump(mode="json")
    found = seed_fields(dump)
    assert found and set(found.values()) == {3}, found
    assert set(found) == set(seeded.seeds())  # seeds() lists every seed field the dump holds
    assert {f"{s}.seed" for s in SEEDED_SECTIONS if getattr(cfg, s) is not None} <= set(found)
    assert "data.seed" in found and ("model.tiny.seed" in found) == (cfg.model.tiny is not None)
    assert cfg.model_dump(mode="json") == before  # the original is untouched

    def unseed(d: Any) -> Any:
        if isinstance(d, dict):
            return {k: None if k == "seed" else unseed(v) for k, v in d.items()}
        return [unseed(v) for v in d] if isinstance(d, list) else d

    assert unseed(dump) == unseed(before)  # only seeds changed
    assert parse_config(dump).seeds() == seeded.seeds()  # the saved run config loads back with the same seeds


def test_teacher_source_seed_is_set():
    assert with_teacher().with_seed(3).data.cold_start_sources[0].seed == 3


def test_embedded_default_is_seed_zero():
    """``r1 run`` with no --seed runs the config's own seeds: the embedded default's are all 0."""
    assert set(load_config(DEFAULT_CONFIG).seeds().values()) == {0}


def test_every_stage_fingerprint_depends_on_the_seed():
    a, b = load_config().with_seed(1), load_config().with_seed(2)
    for name in ("data", *SEEDED_SECTIONS):
        extra_a = {"model": a.model.model_dump(mode="json")} if name == "data" else None
        extra_b = {"model": b.model.model_dump(mode="json")} if name == "data" else None
        assert fingerprint(name, getattr(a, name), {}, extra_a) != fingerprint(name, getattr(b, name), {}, extra_b)
    same = load_config().with_seed(1)
    assert fingerprint("grpo_train", same.grpo_train, {}) == fingerprint("grpo_train", a.grpo_train, {})
