"""The other nodes of a multi-node training stage: torchrun only, no Prefect flow run of their own.

    R1_NNODES=2 R1_NODE_RANK=1 R1_RDZV_ENDPOINT=node0:29400 R1_RDZV_ID=job-7 R1_STORE=s3://bucket/r1 \
        python -m tasks.runner.follower

Node 0 runs the stage task (one Prefect flow run). Before it starts ``torchrun --nnodes N`` it leaves its
training spec (a ``tasks.config.training_spec.TrainingSpec``) in the store under ``R1_RDZV_ID``
(``Store.node_spec_path``); a follower waits for that spec, fetches the same inputs and resume checkpoint from
the store (checked against their manifests), and joins the same c10d rendezvous with its own ``R1_NODE_RANK``.
It commits no output: global rank 0, on node 0, writes the model and node 0's task commits it; a checkpoint its
ranks upload is fenced on node 0's lease (the owner's token comes with the spec). The multi-node Kubernetes pool
starts this in pods 1..N-1.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from tasks.config.training_spec import TrainingSpec
from tasks.runner.launch import resolve_nodes
from tasks.runner.worker import fetch_checkpoint, launch_training
from tasks.storage.fence import owner_from_env
from tasks.storage.lease import fenced_as
from tasks.storage.manifest import StageRef
from tasks.storage.store import Store

WAIT_ENV = "R1_FOLLOWER_WAIT_S"
log = logging.getLogger("tasks.runner.follower")


def wait_for_spec(store: Any, rdzv_id: str, timeout_s: float) -> dict[str, Any] | None:
    """Node 0's ``{"spec", "inputs"}`` for ``rdzv_id``, or None after ``timeout_s``."""
    path = store.node_spec_path(rdzv_id)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            return store.read_json(path)
        except FileNotFoundError:
            time.sleep(1.0)
    return None


def follow(env: dict[str, str] | None = None) -> int:
    """Join one multi-node training run as a non-zero node; the exit status."""

    env = dict(os.environ if env is None else env)
    nodes = resolve_nodes(env)
    if nodes.nnodes < 2 or nodes.node_rank == 0:
        sys.exit(f"tasks.runner.follower: R1_NNODES={nodes.nnodes}, R1_NODE_RANK={nodes.node_rank}: followers are nodes "
                 "1..N-1 of a multi-node stage (node 0 runs the stage task)")
    if not env.get("R1_RDZV_ID"):
        sys.exit("tasks.runner.follower: set R1_RDZV_ID to the id node 0 uses (the work pool's rdzv_id job variable)")
    store = Store(check=False)  # R1_STORE
    timeout = float(env.get(WAIT_ENV, "3600"))
    log.info("node %d of %d: waiting up to %.0fs for node 0's spec %s", nodes.node_rank, nodes.nnodes, timeout,
             store.node_spec_path(nodes.rdzv_id))
    found = wait_for_spec(store, nodes.rdzv_id, timeout)
    if found is None:  # e.g. node 0 reused a committed output and trained nothing
        log.warning("no spec from node 0 within %.0fs (%s); nothing to train", timeout, WAIT_ENV)
        return 0
    work = Path(env.get("R1_WORKDIR") or tempfile.gettempdir()) / "r1-follower" / nodes.rdzv_id / str(nodes.node_rank)
    local = {"output_dir": str(work / "train" / "out")}
    for key, source in found["inputs"].items():  # model_path, rows_path as node 0 fetched them
        ref = StageRef.from_dict(source["ref"], store.url)
        local[key] = str(store.get_output(ref, source["name"], work / "inputs" / ref.stage / source["name"]))
    spec = TrainingSpec.model_validate(found["spec"]).model_copy(update=local)
    fetch_checkpoint(spec, lambda event: None)
    fence = owner_from_env(found.get("fence") or {})  # node 0's lease: its ranks here commit for it
    if fence is None:
        launch_training(spec, lambda event: None, nodes=nodes)
    else:
        with fenced_as(Store(spec.store, check=False), spec.run, fence[0], mode=fence[1]):
            launch_training(spec, lambda event: None, nodes=nodes)
    log.info("node %d: training finished", nodes.node_rank)
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(__doc__)
        sys.exit(0)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)
    sys.exit(follow())
