"""Every benchmark script runs: each ``tests/benchmarks/*.py`` with a ``__main__`` block, in its quick mode.

The convention every benchmark script follows:
- ``python tests/benchmarks/NAME.py`` with no arguments runs the full measurement (what the README quotes);
- ``python tests/benchmarks/NAME.py --quick`` runs the same code path at tiny sizes, in well under a minute on a
  2-core CPU, and exits 0 (what this test runs; the numbers mean nothing);
- both print their result last, as one JSON line where the script has a summary.

Scripts are found by glob (helpers ``_*.py`` and tests ``test_*.py`` aside), so a new script is covered as soon as it
lands: without ``--quick`` in its source it fails here. ``NOT_RUN`` lists the scripts skipped, each with why (those
not converted yet); converting one means adding ``--quick`` and taking it off the list. ``EXTENDED`` lists those whose
quick mode takes minutes on the 2-core CPU: they run in the extended tier (``pytest -m extended``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

HERE = Path(__file__).parent
ROOT = HERE.parents[1]
SCRIPTS = sorted(p for p in HERE.glob("*.py")
                 if not p.name.startswith(("_", "test_")) and "__main__" in p.read_text())
NOT_RUN = {  # name -> why it is skipped
    "async_accuracy.py": "needs --store of finished runs",
    "gpu_check.py": "GPU only",
    "logprob_memory.py": "not converted yet",
    "mixture_seeds.py": "needs --store of finished runs",
    "plan_vs_measured.py": "not converted yet",
    "rejection_throughput.py": "not converted yet",
    "reward_throughput.py": "not converted yet",
    "sft_memory.py": "not converted yet",
    "verify_agreement.py": "not converted yet",
}
EXTENDED = {  # quick modes of minutes: they run in the extended tier (`pytest -m extended`), not in CI's
    "grpo_vs_trl.py",  # several children: ~150 s
    "fetch_verify_cost.py",  # prepares the embedded default's data: over 300 s
    "async_vs_sync.py",  # ~85 s
    "fsdp_load_memory.py",  # two ranks of a ~48M model: ~85 s in CI
}


def dedicated_test(script: Path) -> str | None:
    """The test file beside it that runs ``script --quick`` and checks its output already (run once, not twice)."""
    for test in sorted(HERE.glob("test_*.py")):
        text = test.read_text()
        if test.name != Path(__file__).name and script.name in text and "--quick" in text:
            return test.name
    return None


def _param(script: Path):  # type: ignore[no-untyped-def]
    covered = dedicated_test(script)
    why = NOT_RUN.get(script.name) or (f"its --quick runs in {covered}" if covered else None)
    marks = [pytest.mark.skip(reason=why)] if why else []
    if script.name in EXTENDED:
        marks.append(pytest.mark.extended)
    return pytest.param(script, id=script.stem, marks=marks)


@pytest.mark.parametrize("script", [_param(s) for s in SCRIPTS])
def test_benchmark_script_runs_in_quick_mode(script: Path) -> None:
    assert "--quick" in script.read_text(), f"{script.name}: add a --quick flag (see {Path(__file__).name}'s docstring)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, str(script), "--quick"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=900 if script.name in EXTENDED else 300)
    assert proc.returncode == 0, f"{script.name} --quick failed:\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"{script.name} --quick printed nothing"


def test_scripts_are_discovered() -> None:
    names = {s.name for s in SCRIPTS}
    assert {"checkpoint_memory.py", "fsdp_load_memory.py"} <= names
    assert dedicated_test(HERE / "checkpoint_memory.py") == "test_checkpoint_memory.py"
    assert not (set(NOT_RUN) | EXTENDED) - names, "NOT_RUN or EXTENDED names a script that is gone"
