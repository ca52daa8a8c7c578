"""A run's current lineage: which committed output of each stage the run stands on now.

A run can hold several committed outputs of one stage (config A, then B, then A again reuses A's outputs;
``r1 stage X`` rebuilds X). The newest is not the current one: after A -> B -> A the current outputs are A's,
which are older than B's. So every stage flow records the output it ran or reused in ``{run}/_run/lineage.json``
(``record``), and whatever asks "what does this run stand on" (status, the report, a later ``r1 stage``'s
upstream inputs) reads it back (``current``); a stage the file does not name (a run from before the file
existed, or never run) falls back to its newest committed output.

A current output is *stale* when an output in its ancestry (its parents, their parents, ...) in the same run is not
that stage's current output: an upstream stage was rerun since it, or what it was built on, was built
(``stale_parents``).
"""

from __future__ import annotations

from typing import Any

from tasks.storage.manifest import IntegrityError, StageRef, ref_from_manifest
from tasks.storage.store import Store

LINEAGE = "lineage.json"


def record(store: Store, ref: StageRef) -> None:
    """Make ``ref`` its stage's current output in its run (read, update one entry, write back: one writer per
    run holds the lease, so there is no lost update to guard against). The write is a commit to the run, under its
    fence (``Store.write_run_file``): a writer that lost the run cannot move what the run stands on."""
    saved = store.read_run_file(ref.run, LINEAGE) or {}
    stages = dict(saved.get("stages") or {})
    stages[ref.stage] = {"path": ref.path, "version": ref.version}
    store.write_run_file(ref.run, LINEAGE, {"stages": stages})


def current(store: Store, run: str, stage: str, recorded: dict[str, Any] | None = None) -> StageRef | None:
    """The output of ``stage`` that ``run`` stands on: the recorded one while it is still committed, else the
    newest committed one (None when there is none). ``recorded``: the lineage file already read."""
    entry = ((recorded if recorded is not None else read(store, run)).get("stages") or {}).get(stage)
    if entry:
        ref = StageRef(run=run, stage=stage, version=entry["version"], path=entry["path"], fingerprint="",
                       created="", store_url=store.url)
        try:
            return ref_from_manifest(store.manifest(ref), store.url)
        except IntegrityError:  # deleted or damaged since: what is committed now
            pass
    return store.latest(run, stage)


def read(store: Store, run: str) -> dict[str, Any]:
    return store.read_run_file(run, LINEAGE) or {}


def current_refs(store: Store, run: str, stages: list[str]) -> dict[str, StageRef | None]:
    """``current`` for each of ``stages``, reading the lineage file once."""
    recorded = read(store, run)
    return {s: current(store, run, s, recorded) for s in stages}


def stale_parents(store: Store, refs: dict[str, StageRef | None]) -> dict[str, list[str]]:
    """For each output in ``refs``, the stages of the same run in its ancestry (parents, their parents, ...: the
    exact outputs it was built from) that are no longer their stage's current output (``refs`` maps every stage to
    its current output). Transitive: after an upstream stage reruns, ``final_rl`` built on the SFT model built on the
    old upstream output is stale although its direct parents are still current."""
    manifests: dict[str, dict[str, Any]] = {}  # path -> manifest, each ancestor read once

    def parents(run: str, path: str) -> list[tuple[str, str, str]]:
        """``(run, stage, version)`` of each parent of the output at ``path``; none when it is gone."""
        if path not in manifests:
            r, s, v = (path.split("/") + ["", "", ""])[:3]
            try:
                manifests[path] = store.manifest(StageRef(run=r, stage=s, version=v, path=path, fingerprint="",
                                                          created="", store_url=store.url))
            except IntegrityError:  # deleted or damaged since: its own ancestry cannot be followed
                manifests[path] = {}
        return [tuple((str(p.get("path", "")).split("/") + ["", "", ""])[:3])  # type: ignore[misc]
                for p in (manifests[path].get("parents") or {}).values()]

    stale: dict[str, list[str]] = {}
    for stage, ref in refs.items():
        if ref is None:
            continue
        moved, seen, todo = set(), set(), parents(ref.run, ref.path)
        while todo:
            run, stage_of_parent, version = todo.pop()
            if run != ref.run or (stage_of_parent, version) in seen:
                continue
            seen.add((stage_of_parent, version))
            now = refs.get(stage_of_parent)
            if now is not None and version != now.version:
                moved.add(stage_of_parent)
            todo.extend(parents(run, f"{run}/{stage_of_parent}/{version}"))
        if moved:
            stale[stage] = sorted(moved)
    return stale
