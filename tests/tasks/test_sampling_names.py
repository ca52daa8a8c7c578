"""The older sampling names in a pipeline config (issue 41): ``num_samples`` / ``max_new_tokens`` written in any
section that samples still read, for one release, with a FutureWarning naming the field where the file has it and its
new spelling, into the very config the new spelling gives: the same values and the same fields marked as set (so
every fingerprint and what a trainer is handed stay the same)."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from pydantic import BaseModel

from grpo_core.config import SAMPLING_RENAMES
from tasks.config.pipeline import ConfigError, parse_config

TEACHER = {"kind": "teacher", "model": "/models/teacher"}
# where a section that samples sits in a pipeline config -> how to put sampling fields there
PLACES = {
    "grpo_train": lambda fields: {"grpo_train": fields},
    "final_rl": lambda fields: {"final_rl": fields},
    "evaluate": lambda fields: {"evaluate": fields},
    "rejection_sample": lambda fields: {"rejection_sample": fields},
    "data.cold_start_sources.0": lambda fields: {"data": {"cold_start_sources": [{**TEACHER, **fields}]}},
}


def fields_set(value: Any) -> Any:
    """Every model's fields marked as set, recursively: what ``exclude_unset`` dumps (the hand-off) follow."""
    if isinstance(value, BaseModel):
        return (value.model_fields_set, {k: fields_set(getattr(value, k)) for k in type(value).model_fields})
    if isinstance(value, (list, tuple)):
        return [fields_set(v) for v in value]
    return None


def load(sections: dict[str, Any]):
    return parse_config({"model": {"tiny": {}}, **sections}, "c.yaml")


@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("old", SAMPLING_RENAMES)
def test_an_older_name_warns_naming_its_field_and_new_spelling(place, old):
    new = SAMPLING_RENAMES[old]
    with pytest.warns(FutureWarning) as caught:
        older = load(PLACES[place]({old: 16}))
    messages = [str(w.message) for w in caught if issubclass(w.category, FutureWarning)]
    assert messages == [f"{place}.{old} is now {place}.sampling.{new}: the older name is read until the next release; "
                        "write the new one"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        nested = load(PLACES[place]({"sampling": {new: 16}}))
    assert older == nested
    assert older.model_dump(mode="json") == nested.model_dump(mode="json")  # what the fingerprints hash
    assert fields_set(older) == fields_set(nested)


def test_an_older_name_beside_a_different_new_one_is_refused_at_its_section():
    with pytest.raises(ConfigError, match=r"c.yaml: evaluate: Value error, num_samples: 2 and sampling.num_generations: "
                                          r"3 are both set"):
        load({"evaluate": {"num_samples": 2, "sampling": {"num_generations": 3}}})
