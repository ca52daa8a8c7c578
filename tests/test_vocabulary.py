"""One sampling vocabulary (issue 41): what users read, the shipped configs, the README's and the docs site's examples, the short road's
docstring and the command-line flags, spells the sampling settings as the code does, nested under ``sampling:``
with TRL's names. The older names (``grpo_core.config.SAMPLING_RENAMES``) are read for one release with a warning
(tests/grpo_core/test_sampling_config.py, tests/tasks/test_sampling_names.py), and used nowhere here."""

from __future__ import annotations

import ast
import re
import textwrap
import warnings
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

import grpo_core.train
from grpo_core.config import SAMPLING_RENAMES, GRPOSampling, SamplingConfig, TeacherSampling
from tasks.config.pipeline import load_config
from tasks.config.stages import entries

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
# where sampling settings sit: the pipeline sections that sample, and the short road's ``grpo:``
SAMPLERS: dict[str, type[SamplingConfig]] = {s.config_key: s.section.model_fields["sampling"].annotation
                                             for s in entries() if "sampling" in s.section.model_fields}
SAMPLERS["grpo"] = GRPOSampling
OLDER_FLAGS = {f"--{old.replace('_', '-')}" for old in SAMPLING_RENAMES}


def flat_sampling_keys(config: Any) -> list[str]:
    """``section.key`` for each sampling setting a (possibly partial) config writes outside ``sampling:``: a field
    beside it, or an older name. A section or teacher source written right reads back unchanged."""
    if not isinstance(config, dict):
        return []
    found = []
    for key, cls in SAMPLERS.items():
        section = config.get(key)
        if isinstance(section, dict):
            found += [f"{key}.{k}" for k in section if k in cls.model_fields or k in SAMPLING_RENAMES]
    sources = config.get("data", {}).get("cold_start_sources", []) if isinstance(config.get("data"), dict) else []
    for j, source in enumerate(sources):
        if isinstance(source, dict) and source.get("kind") == "teacher":
            found += [f"data.cold_start_sources.{j}.{k}" for k in source
                      if k in TeacherSampling.model_fields or k in SAMPLING_RENAMES]
    return found


def readme_blocks(language: str) -> list[tuple[str, str]]:
    """(file:line, text) of the fenced code blocks in ``language`` of what users read, dedented: the README and
    every page of the docs site."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text()
        out += [(f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}", textwrap.dedent(m.group(1)))
                for m in re.finditer(rf"```{language}\n(.*?)```", text, re.S)]
    return out


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_a_shipped_config_nests_its_sampling_settings_under_their_names(path):
    assert flat_sampling_keys(yaml.safe_load(path.read_text())) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)  # no older name read anywhere
        load_config(path)


def test_the_readme_the_docs_and_the_short_road_write_the_nested_names():
    blocks = readme_blocks("yaml")
    assert len(blocks) >= 5
    doc = grpo_core.train.__doc__
    blocks.append(("grpo_core/train.py", textwrap.dedent(doc.split("::\n\n", 1)[1].split("\n\n", 1)[0])))  # python -m grpo_core.train's
    for line, block in blocks:
        assert flat_sampling_keys(yaml.safe_load(block)) == [], f"{line}"
    calls = 0
    for line, block in readme_blocks("python"):
        for node in ast.walk(ast.parse(block.replace(", ...]", "]"))):
            if isinstance(node, ast.Call) and getattr(node.func, "id", "").endswith(("Config", "Source")):
                calls += 1
                flat = [k.arg for k in node.keywords if k.arg in SamplingConfig.model_fields or k.arg in SAMPLING_RENAMES]
                assert flat == [], f"{line}: {node.func.id}({', '.join(flat)}=...) outside sampling="
    assert calls
    for line, block in readme_blocks("bash"):
        assert not OLDER_FLAGS & set(block.split()), f"{line}"


def options(command: Any) -> list[tuple[str, str, bool]]:
    """(command path, option, hidden) of every option of ``command`` and its sub-commands."""
    out = [(command.name, opt, param.hidden) for param in command.params for opt in param.opts
           if opt.startswith("--")]
    for sub in getattr(command, "commands", {}).values():
        out += [(f"{command.name} {path}", opt, hidden) for path, opt, hidden in options(sub)]
    return out


def test_no_command_line_flag_spells_an_older_name():
    from flows.cli import app

    shown = {opt for _, opt, hidden in options(typer.main.get_command(app)) if not hidden}
    assert "--num-generations" in shown and "--max-completion-length" in shown
    assert not OLDER_FLAGS & shown


def test_the_older_eval_flags_still_read_with_a_warning(tmp_path):
    from flows.cli import app

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")  # a model folder: the options are checked before anything loads
    runner = CliRunner()
    result = runner.invoke(app, ["eval", str(model), "--benchmarks", "math500", "--num-samples", "2", "--k", "3"])
    assert "warning: --num-samples is now --num-generations" in result.output
    assert result.exit_code == 1 and "k=3 is outside 1..sampling.num_generations (2)" in result.output
    result = runner.invoke(app, ["eval", str(model), "--benchmarks", "math500", "--max-new-tokens", "0"])
    assert "warning: --max-new-tokens is now --max-completion-length" in result.output
    assert result.exit_code == 1 and "sampling.max_completion_length: Input should be greater than 0" in result.output
    result = runner.invoke(app, ["eval", str(model), "-n", "3", "--num-samples", "2"])
    assert result.exit_code == 1 and "--num-samples 2 and --num-generations 3 are both given" in result.output
