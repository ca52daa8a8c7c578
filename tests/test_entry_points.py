"""Every entry point answers ``--help`` with its usage and exit status 0: each module or script with a
``__main__`` block (``python -m grpo_core.train``, the training child, the follower, the generation server,
the benchmark scripts, ...) and every ``r1`` command."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("grpo_core", "tasks", "flows", "infra", "tests/benchmarks")


def has_main_block(path: Path) -> bool:
    """A module-level ``if __name__ == "__main__":``."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and isinstance(node.test.left, ast.Name) \
                and node.test.left.id == "__name__":
            return True
    return False


def entry_points() -> list[Path]:
    return sorted(p for folder in FOLDERS for p in (ROOT / folder).rglob("*.py") if has_main_block(p))


def command(path: Path) -> list[str]:
    """How a user runs it: ``python -m package.module`` inside the packages, the script's path elsewhere."""
    rel = path.relative_to(ROOT)
    if rel.parts[0] in ("grpo_core", "tasks", "flows"):
        return [sys.executable, "-m", ".".join(rel.with_suffix("").parts), "--help"]
    return [sys.executable, str(rel), "--help"]


def test_the_entry_points_are_found():
    found = {str(p.relative_to(ROOT)) for p in entry_points()}
    assert {"grpo_core/train.py", "tasks/runner/worker.py", "tasks/runner/follower.py", "flows/cli.py",
            "grpo_core/generation/serve.py"} <= found


def test_every_entry_point_answers_help_with_status_0():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}

    def run(path: Path) -> tuple[Path, int, str]:
        done = subprocess.run(command(path), cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
        return path, done.returncode, done.stdout + done.stderr

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, entry_points()))
    failed = [f"{p.relative_to(ROOT)}: exit {rc}: {out.strip()[-300:]}" for p, rc, out in results if rc != 0]
    assert not failed, "\n".join(failed)
    silent = [str(p.relative_to(ROOT)) for p, _, out in results if "usage" not in out.lower() and len(out) < 80]
    assert not silent, f"--help printed no usage: {silent}"


@pytest.mark.parametrize("argv, status", [(["--help"], 0), ([], 2), (["a.yaml", "b.yaml"], 2)])
def test_the_short_road_says_how_to_call_it(argv, status, capsys):
    from grpo_core.train import main

    assert main(argv) == status
    out = capsys.readouterr()
    assert "python -m grpo_core.train CONFIG.yaml" in (out.out if status == 0 else out.err)


def test_every_r1_command_answers_help():
    from flows.cli import build_app

    app = build_app()
    names = [c.name or c.callback.__name__ for c in app.registered_commands]
    assert {"run", "stage", "status", "plan", "check", "eval"} <= set(names)
    for name in names:
        result = CliRunner().invoke(app, [name, "--help"])
        assert result.exit_code == 0 and "Usage" in result.output, (name, result.output[-300:])
