"""grpo_core is pure algorithm: it imports and works with the orchestration/storage packages absent."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import grpo_core

BLOCKED = ("prefect", "fsspec", "s3fs", "boto3")  # grpo_core's own imports (the AST test below)
# Blocked at runtime: all but fsspec, which peft (a dependency, for LoRA) imports itself through huggingface_hub's
# HfFileSystem as transformers loads it; a machine without fsspec cannot run transformers + peft at all.
RUNTIME_BLOCKED = ("prefect", "s3fs", "boto3")
PACKAGE_DIR = Path(grpo_core.__file__).parent

# sys.modules[name] = None is how Python spells "not installed" for both `import name` (ModuleNotFoundError)
# and importlib.util.find_spec(name) (None), so optional-dependency probes in transformers/accelerate behave
# as on a machine without these packages, while any real import of them fails.
IMPORT_ALL_BLOCKED = textwrap.dedent(
    f"""
    import importlib, pkgutil, sys
    for name in {RUNTIME_BLOCKED!r}:
        sys.modules[name] = None
    try:
        import s3fs
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit("the block did not work")
    import grpo_core
    names = [m.name for m in pkgutil.walk_packages(grpo_core.__path__, "grpo_core.")]
    for name in names:
        importlib.import_module(name)
    leaked = [n for n in sys.modules if n.split(".")[0] in {RUNTIME_BLOCKED!r} and sys.modules[n] is not None]
    assert not leaked, leaked
    print("imported", len(names), "modules")
    """
)


def test_grpo_core_imports_with_prefect_s3fs_boto3_blocked():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, "-c", IMPORT_ALL_BLOCKED], cwd=PACKAGE_DIR.parent, env=env,
        capture_output=True, text=True, timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    count = int(proc.stdout.split("imported ")[1].split()[0])
    assert count >= 5  # loss, logprobs, config, rewards, ... were all walked


def test_no_module_in_grpo_core_imports_a_blocked_package():
    """Also catches imports inside functions, which importing the modules does not execute."""
    offenders = []
    for path in PACKAGE_DIR.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            offenders += [f"{path.relative_to(PACKAGE_DIR.parent)}:{node.lineno} {n}" for n in names if n.split(".")[0] in BLOCKED]
    assert not offenders, offenders
