"""The short road: GRPO from one YAML file, without Prefect or a store.

    python -m grpo_core.train CONFIG.yaml

The file names a model, a data file of prompt rows and an output folder, and holds the trainer's settings
(``GRPOConfig``, the same fields as the pipeline's ``grpo_train`` section)::

    model: runs/base                  # a local Hugging Face model folder (config.json, weights, tokenizer)
    train_file: data/train.jsonl      # jsonl/json/parquet/csv of prompt rows ({"prompt": ..., "answer": ...})
    output_dir: runs/grpo             # checkpoints, metrics.jsonl and final/ (the trained model)
    data: {field_map: {prompt: question}}   # optional: DatasetSource fields, how the rows are read
    grpo: {max_steps: 100, reward_funcs: [math_accuracy, format], sampling: {use_vllm: false}}
    resume: true                      # optional: continue from output_dir's latest checkpoint

Relative paths are read from the current folder. The rows go through ``grpo_core.data.rows.load_prompt_rows``
(the pipeline's reader: a bad row names its file, line and field); training is ``train_grpo``; the trained
model is ``output_dir/final``. A setting that does not validate fails before any model loads, naming the file
and the field (``train.yaml: grpo.beta: Input should be greater than or equal to 0``).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from grpo_core.config import DatasetSource, GRPOConfig


class TrainFileError(ValueError):
    """A short-road config that cannot run; the message names the file and the field."""


class TrainFile(BaseModel):
    """The YAML of ``python -m grpo_core.train``: model, data, output and the GRPO settings."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(..., min_length=1, description="local Hugging Face model folder to train")
    train_file: str = Field(..., min_length=1, description="jsonl/json/parquet/csv file (or folder) of prompt rows")
    output_dir: str = Field(..., min_length=1, description="where checkpoints, metrics and final/ are written")
    data: dict[str, Any] = Field(default_factory=dict, description="DatasetSource fields other than path "
                                 "(field_map, prompt_template, answer_format, task, keep_columns, max_rows, ...)")
    grpo: GRPOConfig = Field(default_factory=GRPOConfig, description="the trainer's settings (GRPOConfig)")
    resume: bool = Field(True, description="continue from the latest checkpoint in output_dir")

    def source(self) -> DatasetSource:
        """How the rows are read: ``train_file`` with the ``data`` fields."""
        return DatasetSource(path=self.train_file, **self.data)


def _problems(path: Path, error: ValidationError, prefix: str = "") -> list[str]:
    """One line per bad field: ``file: dotted.field: message``."""
    return [f"{path}: {prefix}{'.'.join(map(str, err['loc'])) or '(top level)'}: {err['msg']}" for err in error.errors()]


def read_train_file(path: str | Path) -> TrainFile:
    """Parse and validate ``path``; a ``TrainFileError`` names the file and each bad field."""
    import yaml

    path = Path(path)
    if not path.is_file():
        raise TrainFileError(f"{path}: no such config file (usage: python -m grpo_core.train CONFIG.yaml)")
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise TrainFileError(f"{path}: expected a mapping with model, train_file, output_dir and grpo")
    try:
        config = TrainFile.model_validate(data)
    except ValidationError as e:
        raise TrainFileError("\n".join(_problems(path, e))) from None
    if "path" in config.data:
        raise TrainFileError(f"{path}: data.path: the rows are train_file; remove data.path")
    try:
        config.source()
    except ValidationError as e:
        raise TrainFileError("\n".join(_problems(path, e, prefix="data."))) from None
    if not (Path(config.model) / "config.json").is_file():
        raise TrainFileError(f"{path}: model: {config.model} is not a Hugging Face model folder (no config.json)")
    if not Path(config.train_file).exists():
        raise TrainFileError(f"{path}: train_file: {config.train_file} does not exist")
    return config


def run(config: TrainFile) -> dict[str, Any]:
    """Load the rows and train; returns the last step's metrics (the model is in ``output_dir/final``)."""
    # heavy import (torch, transformers): --help and a config's problems answer without them
    from grpo_core.data.rows import load_prompt_rows
    from grpo_core.trainer.loop import train_grpo

    rows, _ = load_prompt_rows(config.source())
    return train_grpo(config.grpo, config.model, rows, config.output_dir, resume=config.resume)


def main(argv: list[str] | None = None) -> int:
    """``python -m grpo_core.train CONFIG.yaml``: exit 0 with the trained model in ``output_dir/final``,
    2 with the config's problems on stderr; ``--help``: this module's usage, exit 0."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] in (["-h"], ["--help"]):
        print(__doc__)
        return 0
    if len(args) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        config = read_train_file(args[0])
    except TrainFileError as e:
        print(e, file=sys.stderr)
        return 2
    metrics = run(config)
    print(f"trained {metrics['step']} steps (last reward {metrics.get('reward', float('nan')):.3f}); "
          f"model in {Path(config.output_dir) / 'final'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
