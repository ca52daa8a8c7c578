"""The documentation site: it builds with ``mkdocs build --strict`` (a broken link, a missing page, a page outside
the nav or a link to code that is not there fails), the README stays one screenful that points into it, and every
section of the old README has a home in it."""

from __future__ import annotations

import importlib.util
import logging
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
LINK = re.compile(r"\]\(([^)\s#]+)(#[^)\s]*)?\)")


def nav_pages() -> list[str]:
    def walk(items):
        for item in items:
            for value in item.values():
                yield from (walk(value) if isinstance(value, list) else [value])
    return list(walk(yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]))


def test_mkdocs_build_strict(tmp_path):
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"mkdocs build --strict failed:\n{proc.stdout}\n{proc.stderr}"
    assert (tmp_path / "site" / "reference" / "configuration" / "index.html").is_file()
    # a code link became a copy of the code inside the site
    assert (tmp_path / "site" / "src" / "grpo_core" / "trainer" / "loss.py").is_file()


def test_every_page_is_in_the_nav_and_exists():
    pages = nav_pages()
    missing = [p for p in pages if not (DOCS / p).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"
    on_disk = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md") if "gen" not in p.relative_to(DOCS).parts)
    assert sorted(pages) == on_disk, "a page in docs/ is not in mkdocs.yml's nav (or the other way round)"


def test_readme_is_one_screenful_and_its_links_resolve():
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200, "README.md is over 200 lines: move the detail into docs/"
    broken = [target for target, _ in LINK.findall(text)
              if "://" not in target and not (ROOT / target).exists()]
    assert not broken, f"README.md links to paths that do not exist: {broken}"
    for page in nav_pages():  # every page of the site is reachable from the README or the site's home
        assert f"docs/{page}" in text or f"]({page})" in (DOCS / "index.md").read_text(), page


def load_hooks():
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "gen" / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_code_links_point_at_copies_and_a_missing_file_warns(caplog):
    hooks = load_hooks()
    page = SimpleNamespace(file=SimpleNamespace(src_uri="concepts/stages.md"))
    out = hooks.on_page_markdown("[loss](/grpo_core/trainer/loss.py#L1) and [x](/grpo_core/no_such_module.py)",
                                 page, {}, None)
    assert "[loss](../src/grpo_core/trainer/loss.py)" in out
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.code_links"):
        hooks.on_page_markdown("[x](/grpo_core/no_such_module.py)", page, {}, None)
        hooks.on_page_markdown("[x](/grpo_core/trainer)", page, {}, None)
    messages = [r.getMessage() for r in caplog.records]
    assert any("no_such_module.py, which is not in the repository" in m for m in messages), messages
    assert any("links to the folder grpo_core/trainer" in m for m in messages), messages


OLD_README = {  # a section of the README at 03d278f (its heading or bold lead) -> (its page, words of it there)
    "Quick start (a laptop CPU, no GPU, no hub access)": ("getting-started/laptop.md", "bash infra install.sh 1. install cpu builds of torch and"),
    "Wall against the previous default, same machine, same hour:": ("results/seed-tables.md", "wall against the previous default same machine same hour"),
    "The \"aha\" moment, held out for real (issue 42).": ("results/emergence.md", "stage 0.0% . the countdown task is where checking a"),
    "A length-neutral control": ("results/emergence.md", "0 s own cold start with loss type dr grpo"),
    "Tests": ("development.md", "bash python3 m pip install q e . dev tracking"),
    "Layout": ("concepts/layout.md", "sub packages are floors bottom up each imports only its"),
    "Following `beta` from the YAML to the loss": ("concepts/layout.md", "tasks config pipeline.py load config parses grpo train.beta into pipelineconfig.grpo"),
    "Adding a stage": ("concepts/stages.md", "its body by name module function default tasks.stages. name name"),
    "Using it": ("getting-started/laptop.md", "bash r1 run c configs qwen2.5 0.5b gsm8k.yaml run gsm8k"),
    "Seeds": ("concepts/runs.md", "without it the config s own seeds run the embedded"),
    "Reuse": ("concepts/runs.md", "its config section s fields set away from their defaults"),
    "Stages": ("concepts/stages.md", "cold start sft grpo train rejection sample sft consolidate final"),
    "Emergence features": ("concepts/evaluation.md", "evaluate commits them as eval direct rate eval mean steps"),
    "Checking measured as checking": ("concepts/evaluation.md", "reflection phrase counts as a check only after a try"),
    "The \"aha\" step": ("concepts/evaluation.md", "reflection rate each step s rate a share of its"),
    "Store": ("concepts/store.md", ". every file a stage reads from a committed output"),
    "No call hangs": ("concepts/store.md", "r1 s3 read timeout 60 s for the endpoint a"),
    "Errors": ("troubleshooting.md", "line field and fix a full disk says free space"),
    "Ctrl-C": ("troubleshooting.md", "is taken down the call s flow runs and their"),
    "One writer per run": ("concepts/store.md", "or sent sigterm exit code 143 . a second writer"),
    "Faults, what happens and what to do": ("troubleshooting.md", ". fault what happens how fast what to do test"),
    "Progress": ("concepts/runs.md", "40 100 40% loss 0.0123 reward 0.512 lr 5e 05"),
    "Resume": ("recipes/resume-and-rerun.md", "resumes from the newest complete checkpoint with no step lost"),
    "Configs": ("concepts/runs.md", "a config is parsed once and only serialised where it"),
    "Packed batches": ("concepts/rollouts.md", "grpo section grpo train final rl packs each micro batch"),
    "Sampling settings": ("concepts/rollouts.md", "wherever completions are generated grpo train final rl evaluate rejection"),
    "Over-long prompts": ("concepts/rollouts.md", "sampling.max prompt length default 512 and sampling.long prompts truncate the"),
    "Sampler/trainer gap": ("concepts/rollouts.md", "vllm importance sampling correction true vllm importance sampling mode token"),
    "Asynchronous rollouts": ("concepts/rollouts.md", "generates step n 1 s rollouts with the weights of"),
    "Rollouts on a generation server": ("concepts/rollouts.md", "device generates the others train. the server is python m"),
    "Data": ("concepts/stages.md", "decontaminated from train by n gram overlap written as"),
    "Reward models": ("concepts/rewards.md", "trains an automodelforsequenceclassification num labels 1 a fresh score head"),
    "Experiment trackers and held-out evaluation during RL": ("recipes/trackers.md", "takes report to trl s names any subset jsonl metrics.jsonl"),
    "Held-out evaluation during RL": ("recipes/trackers.md", "verifiable rows of the held out set as the evaluate"),
    "Reward-hacking monitor": ("recipes/trackers.md", "rows of each general source the stage trains on evaluate.general"),
    "Data mixture by source (R1's final RL over reasoning, general and safety prompts)": ("concepts/mixture.md", "every prompt row keeps a source column a built in"),
    "Evaluating like the R1 paper (`r1 eval`)": ("recipes/r1-eval.md", "bash r1 eval exp 1 final rl benchmarks math500 gsm8k"),
    "R1's data at both ends: cold-start traces and the consolidation mix": ("concepts/stages.md", "data.cold start sources takes besides prompt completion files two kinds"),
    "From a notebook (no Prefect)": ("recipes/notebook.md", "python from grpo core.config import grpoconfig from grpo core.trainer.loop import"),
    "LoRA / QLoRA (`use_peft`)": ("recipes/lora.md", "cold start sft reward model grpo train sft consolidate final"),
    "Before your first GPU run (`r1 check`)": ("getting-started/one-gpu.md", "bash r1 check c configs qwen2.5 0.5b gsm8k.yaml exit 0"),
    "Will it fit? (`r1 plan`)": ("getting-started/one-gpu.md", "bash r1 plan c configs qwen2.5 7b math.yaml gpus 8"),
    "Benchmarks (scripts that print numbers, not tests)": ("benchmarks.md", "script what it compares tests benchmarks logprob memory.py chunked per"),
    "`save_rss_ratio` 0.0007, `resume_rss_ratio` 0.58": ("benchmarks.md", "1.27 gb s resume 17.0 s at 0.69 gb s"),
    "1.31": ("benchmarks.md", "train reference x core contention is 1.26 the 1.5 aimed"),
    "`packed_speedup_grpo` 2.41": ("benchmarks.md", "each prompt s forward packed speedup sft unsorted 4.03 against"),
    "`lora_peak_ratio` 0.49, `lora_step_ratio` 0.49": ("benchmarks.md", "parameters need no gradients or adamw state and their weight"),
    "Running on a cluster": ("getting-started/cluster.md", "only the config and store references travel between runs so"),
    "Sharded training and several nodes": ("getting-started/cluster.md", "trains every stage sft and grpo with fsdp2 fully shard"),
}


def words(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9.%]+", text.lower()))


@pytest.mark.parametrize("section", sorted(OLD_README))
def test_every_section_of_the_old_readme_has_a_page(section):
    """Nothing of the 1,173-line README was lost when it shrank: each of its sections is on a page of the site
    (checked by a run of its own words there, so a page rewritten without it fails)."""
    page, phrase = OLD_README[section]
    assert page in nav_pages(), f"{section!r} moved to {page}, which is not in the nav"
    assert phrase in words((DOCS / page).read_text()), f"{section!r}: {page} no longer holds {phrase!r}"


def test_every_benchmark_script_is_on_the_benchmarks_page():
    text = (DOCS / "benchmarks.md").read_text()
    scripts = [p.name for p in (ROOT / "tests" / "benchmarks").glob("*.py") if not p.name.startswith(("test_", "_"))]
    assert scripts
    missing = [name for name in scripts if f"tests/benchmarks/{name}" not in text]
    assert not missing, f"benchmark scripts missing from docs/benchmarks.md: {missing}"
