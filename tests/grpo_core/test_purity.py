"""grpo_core is pure algorithm: it imports and works with the orchestration/storage packages absent."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import grpo_core

BLOCKED = ("prefect", "fsspec", "s3fs", "boto3")
PACKAGE_DIR = Path(grpo_core.__file__).parent

# sys.modules[name] = None is how Python spells "not installed" for both `import name` (ModuleNotFoundError)
# and importlib.util.find_spec(name) (None), so optional-dependency probes in transformers/accelerate behave
# as on a machine without these packages, while any real import of them fails.
# fsspec is different: huggingface_hub depends on it, and peft (a dependency: LoRA) imports huggingface_hub's
# HfFileSystem, which transformers loads whenever peft is installed. So it is refused only when a grpo_core file
# imports it (the frame that runs the import statement), not when a library grpo_core uses does.
THIRD_PARTY_OK = ("fsspec",)
IMPORT_ALL_BLOCKED = textwrap.dedent(
    f"""
    import importlib, os, pkgutil, sys
    for name in {BLOCKED!r}:
        if name not in {THIRD_PARTY_OK!r}:
            sys.modules[name] = None

    class DirectOnly:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] not in {THIRD_PARTY_OK!r}:
                return None
            frame = sys._getframe(1)
            while frame is not None and (frame.f_code.co_filename.startswith("<frozen")
                                         or os.sep + "importlib" + os.sep in frame.f_code.co_filename):
                frame = frame.f_back
            if frame is not None and os.sep + "grpo_core" + os.sep in frame.f_code.co_filename:
                raise ModuleNotFoundError(f"import of {{name}} halted: grpo_core imported it")
            return None

    sys.meta_path.insert(0, DirectOnly())
    try:
        import prefect
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit("the block did not work")
    import grpo_core
    names = [m.name for m in pkgutil.walk_packages(grpo_core.__path__, "grpo_core.")]
    for name in names:
        importlib.import_module(name)
    leaked = [n for n in sys.modules if n.split(".")[0] in {BLOCKED!r} and sys.modules[n] is not None
              and n.split(".")[0] not in {THIRD_PARTY_OK!r}]
    assert not leaked, leaked
    print("imported", len(names), "modules")
    """
)


def test_grpo_core_imports_with_prefect_fsspec_s3fs_boto3_blocked():
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
