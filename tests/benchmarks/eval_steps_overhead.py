# python tests/benchmarks/eval_steps_overhead.py [--quick]
"""What GRPO's held-out evaluation during RL (``eval_steps: 25``) adds to the embedded default's grpo_train stage.

Builds what it needs: a tiny model of the embedded default's shape (configs/tiny-cpu.yaml ``model.tiny``, random init,
not pretrained: its completions run to the length cap in training and evaluation alike, the costliest case for
both) and the train and held-out rows prepare_data makes (``prepare_datasets`` on the default's ``data`` section:
chain and countdown for the stage's mixture, general prompts it leaves aside); then trains the default's
``grpo_train`` section (its sizes, its mixture, its sampler) for 50 steps without and with ``eval_steps: 25`` on
the default's ``eval_samples`` (the first 64 verifiable held-out prompts, as the stage takes them, scored as the
default's ``evaluate`` section says: greedy + 4 samples each). The stage runs 150 steps with one
evaluation per 25, so 50 steps keep its ratio. Prints one JSON line: ``added_fraction`` (the seconds evaluation
took, ``time/eval`` summed, over the stage's seconds without it: the target is <= 0.10), ``measured_fraction``
(wall with / wall without - 1: the same, plus noise on a shared machine), and ``probe_s``, a fixed CPU workload's
seconds, so numbers from a loaded machine can be told apart. ``--quick``: 4 steps, eval_steps 2, 8 prompts.
Not a test: numbers depend on the machine and its load (tests/benchmarks/test_eval_steps_overhead.py runs --quick).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def speed_probe() -> float:
    """Seconds of a fixed single-thread workload (200 fp32 256x256 matmuls): the machine's speed right now."""
    import torch

    a = torch.randn(256, 256, generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    for _ in range(200):
        a = torch.tanh(a @ a)
    return time.perf_counter() - start


def train(section, model_dir: Path, rows, heldout, eval_config, out: Path) -> tuple[float, list[dict]]:
    """Wall seconds of one GRPO run and its metrics rows."""
    from grpo_core.trainer.loop import train_grpo

    start = time.perf_counter()
    extra = {"eval_rows": heldout, "eval_config": eval_config} if section.eval_steps else {}
    train_grpo(section, model_dir, rows, out, resume=False, **extra)
    wall = time.perf_counter() - start
    return wall, [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--quick", action="store_true", help="4 steps, eval_steps 2, 8 held-out prompts (a smoke run)")
    args = parser.parse_args()
    import torch

    from grpo_core.models.tiny import build_tiny_model
    from grpo_core.recipe.prepare import prepare_datasets
    from tasks.config.pipeline import load_config
    from tasks.config.training_spec import trainer_config

    torch.set_num_threads(1)
    default = load_config(None)  # the embedded default, configs/tiny-cpu.yaml
    steps, every, samples = (4, 2, 8) if args.quick else (50, 25, None)
    base = trainer_config("grpo", default.grpo_train, torch_num_threads=1)
    base = base.model_copy(update={"max_steps": steps, "save_steps": steps, "report_to": ["jsonl"]})
    with_eval = base.model_copy(update={"eval_steps": every, **({"eval_samples": samples} if samples else {})})
    eval_config = default.evaluate.model_copy(update={"rm_reward": None, "benchmarks": []})
    data = prepare_datasets(default.data)  # the prepare_data stage's rows: the mixture's sources among them
    train_rows, eval_rows = data.train, data.eval
    shape = default.model.tiny
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny", seed=0, hidden_size=shape.hidden_size,
                                     num_layers=shape.num_layers, num_heads=shape.num_heads,
                                     max_position_embeddings=shape.max_position_embeddings)
        probe = speed_probe()
        plain_s, _ = train(base, model_dir, train_rows, eval_rows, eval_config, Path(tmp) / "plain")
        eval_s_wall, rows = train(with_eval, model_dir, train_rows, eval_rows, eval_config, Path(tmp) / "eval")
        probe = (probe + speed_probe()) / 2
    evals = [r for r in rows if "eval/accuracy" in r]
    eval_s = sum(r["time/eval"] for r in evals)
    print(json.dumps({
        "steps": steps, "eval_steps": every, "eval_samples": with_eval.eval_samples,
        "eval_at": [r["step"] for r in evals], "stage_s_without": round(plain_s, 2), "stage_s_with": round(eval_s_wall, 2),
        "eval_s": round(eval_s, 2), "added_fraction": round(eval_s / plain_s, 4),
        "measured_fraction": round(eval_s_wall / plain_s - 1, 4), "target": 0.10,
        "within_target": eval_s / plain_s <= 0.10, "probe_s": round(probe, 3), "quick": args.quick,
    }))


if __name__ == "__main__":
    main()
