"""Limits of the base model a config's lengths must fit, checked when the config is loaded (``parse_config``).

A prompt plus its completion longer than the model's ``max_position_embeddings`` is not refused by
``generate``: the tiny model (rotary positions) keeps sampling past its trained positions, so a run went to the
end with evaluation generating 500 tokens on a 128-position model. The limit is known before anything runs for
the embedded tiny model (``model.tiny.max_position_embeddings``) and for a real model whose ``config.json`` is a
local, readable file; a hub name is not fetched here (no network at load), so there nothing is checked.

What is compared: the ``sampling.max_completion_length`` a generating section sets in the config (nested or
flat) against the positions. A completion cap is reached whenever the model does not stop, so one past the
positions is refused; a prompt cap (``max_prompt_length``, 512 by default, kept in every dumped config) is a cap
that short prompts never reach, so it is not counted.
Teacher cold-start sources sample with their own model and are not checked against the base model.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from grpo_core.config import SamplingConfig
from tasks.config.stages import entries

def model_positions(config: Any) -> tuple[int, str] | None:
    """``(max_position_embeddings, where it comes from)`` of the base model, or None when it is not known locally."""
    if config.model.tiny is not None:
        return config.model.tiny.max_position_embeddings, "model.tiny.max_position_embeddings"
    path = Path(str(config.model.name_or_path)).expanduser() / "config.json"
    try:
        value = json.loads(path.read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None  # a hub name, or a folder on another machine: the stage finds out
    return (value, f"the max_position_embeddings in {path}") if isinstance(value, int) and value > 0 else None


def position_problems(config: Any) -> list[tuple[tuple, str]]:
    """``(field location, message)`` for each generating section whose set lengths pass the model's positions."""
    limit = model_positions(config)
    if limit is None:
        return []
    positions, source = limit
    problems = []
    for stage in entries():
        section = stage.section_of(config)
        sampling = getattr(section, "sampling", None)
        if not isinstance(sampling, SamplingConfig):
            continue
        if "max_completion_length" not in sampling.model_fields_set or sampling.max_completion_length <= positions:
            continue
        problems.append(((stage.config_key, "sampling", "max_completion_length"),
                         f"sampling.max_completion_length ({sampling.max_completion_length}) is longer than {source} "
                         f"({positions}): generation would run past the positions the model has; lower it or use a "
                         f"model with more positions"))
    return problems
