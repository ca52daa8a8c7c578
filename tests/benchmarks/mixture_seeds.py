# python tests/benchmarks/mixture_seeds.py --store /tmp/mix-seeds --seeds 0 1 2
"""The embedded default's mixed final RL over seeds: issue 12's "must show 1" table.

For each seed, the embedded default (``configs/tiny-cpu.yaml``) with every seed set to it (seed 0 is ``r1 run``
itself) runs as ``r1 run --seed N --run mix-seed<N> --store STORE`` (timed), then ``r1 status --json`` gives the
run's seeds (checked) and, for ``grpo_train`` and ``final_rl``, ``eval/accuracy`` (the chain task),
``eval/rm_score`` (the reward model's mean score on held-out general prompts) and ``eval/preferred_rate`` (the
share of those responses the generating rule passes). A seed passes when final RL's preferred rate is at least
30 points above GRPO's and its accuracy at most 2 points below. Runs already committed in STORE are reused
(the stages are cached), so a rerun only prints the table.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

KEYS = ("eval/accuracy", "eval/rm_score", "eval/preferred_rate")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1])
    parser.add_argument("--store", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        run = f"mix-seed{seed}"
        start = time.perf_counter()
        subprocess.run(["r1", "run", "--seed", str(seed), "--run", run, "--store", args.store], check=True)
        wall = time.perf_counter() - start
        status = json.loads(subprocess.run(["r1", "status", run, "--store", args.store, "--json"], check=True,
                                           capture_output=True, text=True).stdout)
        if set(status["seeds"].values()) != {seed}:
            sys.exit(f"run {run} in {args.store} was not made with seed {seed} everywhere: {status['seeds']}")
        m = {s: status["stages"][s]["metrics"] for s in ("grpo_train", "final_rl")}
        ok = (m["final_rl"]["eval/preferred_rate"] >= m["grpo_train"]["eval/preferred_rate"] + 0.30
              and m["final_rl"]["eval/accuracy"] >= m["grpo_train"]["eval/accuracy"] - 0.02)
        rows.append((seed, wall, m, ok))
    print("| seed | wall s | GRPO accuracy / rm score / preferred | final RL accuracy / rm score / preferred | passes |")
    print("|---|---|---|---|---|")
    for seed, wall, m, ok in rows:
        cells = [" / ".join(f"{m[s].get(k, float('nan')):.3f}" for k in KEYS) for s in ("grpo_train", "final_rl")]
        print(f"| {seed} | {wall:.0f} | {cells[0]} | {cells[1]} | {'yes' if ok else 'no'} |")
    sys.exit(0 if sum(ok for *_, ok in rows) >= 2 else 1)


if __name__ == "__main__":
    main()
