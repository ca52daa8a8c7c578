"""What of a config section a stage's fingerprint holds (``tasks.runner.common.fingerprint``): the fields set away
from their defaults (``keyed_fields``), and the content of the local model folders the section names
(``model_folders``).

Fields at their default are left out, in nested sections and list items too, so a new option with a default changes
no fingerprint: a store's committed stages stay reusable when the code gains an option they do not set. A field whose
type is one literal value (a reward entry's ``type``, a cold-start source's ``kind``) is always kept: it says what the
fields beside it mean (a judge and a reward model naming one folder are two things).

A default changed in code is a code change, and code is not in a fingerprint (no more than a stage's source is:
``tasks/runner/common.py``): a config that leaves the field unset keeps its committed outputs after the default
changes. Rebuild such a stage with ``r1 stage NAME`` (or ``r1 run --from-stage NAME``), or write the field in the
config (a new fingerprint). Keying every default instead made every new option, even one no stage reads, rerun every
stage of every store.

A local model folder counts by its files (relative name, size and sha256, read once per change:
``tasks.storage.file_hashes``; hidden files such as ``.git`` and a download's ``.cache`` left out), so weights replaced
in place are a new fingerprint, not a reused output. ``MODEL_FOLDER_FIELDS`` names the fields that name a model; a
value that is no local folder is keyed by its value alone: a hub name (as before: what the hub cache holds is not
asked), a served model's name (``url`` set), the reward_model stage or a ``run:RUN/STAGE`` output (those are parents,
keyed by their committed versions).
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from pydantic_core import to_jsonable_python

from grpo_core.config import JudgeSpec, RewardModelSpec, TeacherSource
from tasks.config.pipeline import ModelConfig
from tasks.config.sections import ConsolidateConfig, RewardModelStageConfig, is_stage_reference, walk_fields
from tasks.storage.file_hashes import folder_files

# The fields that name a model (a local folder, a hub name, or what the field's help says besides); a new one goes
# here (tests/tasks/test_fingerprint_fields.py fails on a field named like a model that is not listed).
MODEL_FOLDER_FIELDS: dict[type[BaseModel], tuple[str, ...]] = {
    ModelConfig: ("name_or_path",),
    RewardModelSpec: ("model", "ensemble"),
    JudgeSpec: ("model",),
    TeacherSource: ("model",),
    ConsolidateConfig: ("init_model",),
    RewardModelStageConfig: ("model_name_or_path",),
}


def keyed_fields(value: Any) -> Any:
    """``value`` as JSON with every field at its default left out (recursively) and one-literal fields kept. A field
    is at its default when it reads the same as the default does here (a nested section whose fields are all at
    their defaults is at its default, whatever its class)."""
    if isinstance(value, BaseModel):
        out = {}
        for name, info in type(value).model_fields.items():
            keyed = keyed_fields(getattr(value, name))
            if (is_tag(info.annotation) or info.is_required()
                    or keyed != keyed_fields(info.get_default(call_default_factory=True))):
                out[name] = keyed
        return out
    if isinstance(value, (list, tuple)):
        return [keyed_fields(v) for v in value]
    if isinstance(value, dict):
        return {str(k): keyed_fields(v) for k, v in value.items()}
    return to_jsonable_python(value)


def is_tag(annotation: Any) -> bool:
    """A one-literal field (a reward entry's ``type``): always written out, it says which model a mapping is."""
    return typing.get_origin(annotation) is typing.Literal and len(typing.get_args(annotation)) == 1


def model_folders(*sections: BaseModel | None) -> dict[str, dict[str, Any]]:
    """``{path: {file: {"size", "sha256"}}}`` for every local model folder ``sections`` name (module docstring)."""
    out: dict[str, dict[str, Any]] = {}
    for section in sections:
        for value in walk_fields(section):
            if not isinstance(value, tuple(MODEL_FOLDER_FIELDS)) or getattr(value, "url", None) is not None:
                continue  # not a model field's owner, or a served model (`model` is the server's name for it)
            names = [n for cls, fields in MODEL_FOLDER_FIELDS.items() if isinstance(value, cls) for n in fields]
            for name in names:
                if name == "model" and is_stage_reference(value):
                    continue
                field = getattr(value, name)
                for path in field if isinstance(field, list) else [field]:
                    if isinstance(path, str) and path not in out and Path(path).expanduser().is_dir():
                        out[path] = folder_files(Path(path).expanduser(), skip_hidden=True)
    return out
