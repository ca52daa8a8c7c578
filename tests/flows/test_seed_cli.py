"""``r1 run --seed N`` through the real CLI, Prefect and pipeline (configs/ci-tiny.yaml, a local store):
the run's saved config, ``r1 status --json`` and every committed stage's manifest carry seed N in every section;
the same seed again reuses every stage; another seed on that run is refused by ``r1 run`` and ``r1 stage``
before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.cli import app
from flows.stages import RUN_CONFIG
from tasks.storage.store import Store
from tests.tasks.test_seed import seed_fields

CI_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ci-tiny.yaml"
RUN = "seeded"
pytestmark = pytest.mark.slow  # ~15 s of pipeline on idle cores, minutes when they are shared


@pytest.fixture(scope="module")
def seeded_run(tmp_path_factory):
    store = tmp_path_factory.mktemp("seed-store")
    result = CliRunner().invoke(app, ["run", "-c", str(CI_CONFIG), "--seed", "3", "--run", RUN, "--store", str(store)])
    assert result.exit_code == 0, result.output
    return Store(store)


def _files(store: Store) -> list[str]:
    root = Path(store.url.removeprefix("file://"))
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if "_run" not in p.parts)


def test_seed_reaches_the_saved_config_status_and_every_stage(seeded_run):
    saved = seed_fields(seeded_run.read_run_file(RUN, RUN_CONFIG)["config"])
    assert {"model.tiny.seed", "data.seed", "cold_start_sft.seed", "grpo_train.seed", "rejection_sample.seed",
            "sft_consolidate.seed", "final_rl.seed", "evaluate.seed"} <= set(saved)
    assert set(saved.values()) == {3}

    result = CliRunner().invoke(app, ["status", RUN, "--json", "--store", seeded_run.url])
    assert result.exit_code == 0, result.output
    status = json.loads(result.output)
    assert status["seeds"] == saved

    committed = [s for s, info in status["stages"].items() if info["state"] == "completed"]
    assert len(committed) >= 6
    for stage in committed:  # each stage ran with, and recorded, seed 3 (its section and the tiny model)
        manifest = seeded_run.manifest(seeded_run.latest(RUN, stage))
        seeds = seed_fields(manifest["config"])
        assert "model.tiny.seed" in seeds and len(seeds) >= 2 and set(seeds.values()) == {3}, (stage, seeds)


def test_same_seed_reuses_every_stage(seeded_run):
    before = _files(seeded_run)
    result = CliRunner().invoke(app, ["run", "-c", str(CI_CONFIG), "--seed", "3", "--run", RUN,
                                      "--store", seeded_run.url])
    assert result.exit_code == 0, result.output
    assert [f for f in _files(seeded_run) if "_report" not in f] == [f for f in before if "_report" not in f]


@pytest.mark.parametrize("args", [["run", "-c", str(CI_CONFIG)], ["stage", "grpo_train"],
                                  ["stage", "grpo_train", "-c", str(CI_CONFIG)]])
def test_another_seed_on_the_run_is_refused_before_anything_is_written(seeded_run, args):
    before = _files(seeded_run)
    result = CliRunner().invoke(app, [*args, "--seed", "4", "--run", RUN, "--store", seeded_run.url])
    assert result.exit_code == 1, result.output
    line = result.output.strip().splitlines()[-1]
    assert line.startswith(f"error: run '{RUN}' in {seeded_run.url} was started with model.tiny.seed=3, data.seed=3")
    assert "not --seed 4" in line and "drop --seed" in line and "r1 run --seed 4 --run NEW-NAME" in line
    assert _files(seeded_run) == before
