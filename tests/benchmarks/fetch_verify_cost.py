# python tests/benchmarks/fetch_verify_cost.py [--repeat 30] [--quick]
"""What checking fetched files against their manifests costs on the embedded default (configs/tiny-cpu.yaml).

Commits one prepare_data output of the embedded default to a local store in a temporary folder, then
fetches each of its files and the tiny model folder (``base_model``, the size of every model a run moves)
three ways, medians of ``--repeat``: a plain copy (fetching before verification existed), ``get_output``
with nothing verified yet in the process (every byte hashed while it streams), and ``get_output`` again
(the process-level cache: same file identity, copied without hashing). Then sums the verified fetches one
``r1 run`` makes (counted in tasks/*.py) against the run's wall time (README: 6 min 39 s on this project's
2-core machine). Prints a table and one JSON line. Not a test: numbers depend on the machine and its load.
``--quick``: one repeat, and the tiny base pretrained for 2 steps instead of 1,200 (the files, and so what is
fetched and hashed, are the same size; the pretraining was ~400 s of the quick run's ~490 s on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN_WALL_S = 6 * 60 + 39
# Fetches in one `r1 run` of the embedded default: model folders (base_model-sized) by cold_start_sft, the
# four evaluations, grpo_train, rejection_sample, sft_consolidate and final_rl; train.parquet by grpo_train,
# rejection_sample and final_rl, plus rejection_sample's samples.parquet (counted as train.parquet, larger);
# cold_start.parquet by cold_start_sft and sft_consolidate; eval.parquet by the four evaluations.
FETCHES = {"base_model": 9, "train.parquet": 4, "cold_start.parquet": 2, "eval.parquet": 4}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="one repeat, 2 pretraining steps (what the test of every "
                    "benchmark runs)")
    args = ap.parse_args()
    if args.quick:
        args.repeat = 1

    import tasks.storage.store as store_module
    from tasks.config.pipeline import load_config
    from tasks.config.stages import get_stage
    from tasks.storage.store import Store

    tmp = Path(tempfile.mkdtemp(prefix="r1-verify-cost-"))
    try:
        config = load_config(ROOT / "configs" / "tiny-cpu.yaml")
        if args.quick:  # the same files, a base barely pretrained
            tiny = config.model.tiny
            pretrain = tiny.pretrain.model_copy(update={"max_steps": 2, "save_steps": 2})
            config = config.model_copy(update={"model": config.model.model_copy(
                update={"tiny": tiny.model_copy(update={"pretrain": pretrain})})})
        ref = get_stage("prepare_data").task.fn(config, "m", str(tmp / "store"))
        store = Store(tmp / "store")
        files = store.manifest(ref)["files"]
        hashing = [0.0]
        stream = Store._stream_hashed

        def timed_stream(self, rpath, dest, *args, **kwargs):  # noqa: ANN001, ANN202 - counts the seconds spent hashing
            out = stream(self, rpath, dest, *args, **kwargs)
            hashing[0] += out[2]
            return out

        Store._stream_hashed = timed_stream

        def plain(name: str, dest: Path) -> None:
            for rel in (r for r in files if r == name or r.startswith(f"{name}/")):
                target = dest if rel == name else dest / rel[len(name) + 1:]
                target.parent.mkdir(parents=True, exist_ok=True)
                store.fs.get_file(store.path(ref.path, rel), str(target))

        rows = {}
        for name in FETCHES:
            times: dict[str, list[float]] = {"plain": [], "verified": [], "hashing": [], "cached": []}
            for i in range(args.repeat):
                dl = tmp / "dl" / str(i)
                t = time.perf_counter()
                plain(name, dl / "plain" / name)
                times["plain"].append(time.perf_counter() - t)
                store_module._VERIFIED.clear()
                hashing[0] = 0.0
                t = time.perf_counter()
                store.get_output(ref, name, dl / "verified" / name)
                times["verified"].append(time.perf_counter() - t)
                times["hashing"].append(hashing[0])
                t = time.perf_counter()
                store.get_output(ref, name, dl / "cached" / name)
                times["cached"].append(time.perf_counter() - t)
                shutil.rmtree(dl)
            size = sum(v["size"] for r, v in files.items() if r == name or r.startswith(f"{name}/"))
            rows[name] = {"bytes": size, **{k: statistics.median(v) * 1e3 for k, v in times.items()}}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"{'fetch':<20}{'MB':>7}{'plain ms':>10}{'verified ms':>13}{'hashing ms':>12}{'again ms':>10}")
    for name, r in rows.items():
        print(f"{name:<20}{r['bytes'] / 1e6:>7.2f}{r['plain']:>10.2f}{r['verified']:>13.2f}{r['hashing']:>12.2f}"
              f"{r['cached']:>10.2f}")
    extra = sum(n * (rows[k]["verified"] - rows[k]["plain"]) for k, n in FETCHES.items()) / 1e3
    hashed = sum(n * rows[k]["hashing"] for k, n in FETCHES.items()) / 1e3
    print(f"one r1 run, every fetch verified from scratch: +{extra * 1e3:.1f} ms over plain copies "
          f"({100 * extra / RUN_WALL_S:.4f}% of {RUN_WALL_S} s), hashing {hashed * 1e3:.1f} ms "
          f"({100 * hashed / RUN_WALL_S:.4f}%)")
    print(json.dumps({"rows": rows, "run_extra_s": extra, "run_hashing_s": hashed, "run_wall_s": RUN_WALL_S}))


if __name__ == "__main__":
    main()
