"""Held out by problem, not by spelling (issue 42): a built-in task's held-out problems are in no training prompt,
cold-start trace or pretraining row in any order of their numbers, and prepare_data fails a run whose are."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from grpo_core.data import countdown, synthetic
from grpo_core.data.rows import DataError
from grpo_core.recipe.prepare import canonical_problem, check_held_out, held_out_overlap, prepare_datasets

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny-cpu.yaml"


def _text(row: dict) -> str:
    return row["prompt"][0]["content"]


def test_canonical_problems_fold_the_tasks_symmetries():
    assert canonical_problem("3,8,5->13:") == canonical_problem("5,3,8->13:") == canonical_problem(" 8,5,3->13: ")
    assert canonical_problem("3,8,5->13:") != canonical_problem("3,8,5->11:")  # another target: another problem
    assert countdown.problem_key("3,8,5->13:", "+") != countdown.problem_key("3,8,5->13:", "+*")
    assert canonical_problem("3+5*2=") == canonical_problem("5+3*2=")  # the first pair commutes
    assert canonical_problem("5-3*2=") != canonical_problem("3-5*2=")
    assert canonical_problem("3+5*2=") != canonical_problem("3*5+2=")
    assert canonical_problem("Natalia sold clips to 48 friends") is None


def test_the_old_split_by_prompt_string_leaks_held_out_problems_and_the_check_names_them():
    """Today's data before issue 42: held-out countdown rows kept apart only as exact prompt strings, three numbers
    in 1..9 (324 problems): nearly every held-out problem is in the training prompts with its numbers reordered."""
    held = countdown.make_countdown_rows(200, seed=1, max_number=9)
    texts = {_text(r) for r in held}
    train = [r for r in countdown.make_countdown_rows(1200, seed=0, max_number=9, unique=False)
             if _text(r) not in texts]
    found = held_out_overlap(held, {"train": train})
    problems = {canonical_problem(t) for t in texts}
    assert len(problems) < 170 and len({canonical_problem(etext) for *_, etext in found}) > 0.8 * len(problems)
    name, text, eid, etext = found[0]
    assert name == "train" and text != etext and canonical_problem(text) == canonical_problem(etext)
    with pytest.raises(DataError, match=r"training rows hold a held-out problem.*train row '\d+,\d+,\d+->\d+:' is "
                                        r"eval row countdown-1-\d+"):
        check_held_out(held, {"train": train})


def test_splits_hold_out_problems_in_any_order_of_their_numbers():
    train, ev = countdown.make_countdown_splits(1200, 200, seed=3, unique_train=True)
    keys = [countdown.problem_key(_text(r)) for r in ev]
    assert len(set(keys)) == 200  # distinct problems, not spellings
    assert not set(keys) & {countdown.problem_key(_text(r)) for r in train}
    assert len({_text(r) for r in train}) == 1200 and all(r["operators"] == "+" for r in train + ev)
    c_train, c_eval = synthetic.make_chain_splits(2000, 200, seed=3)
    chain_keys = {synthetic.problem_key(_text(r)) for r in c_eval}
    assert len(chain_keys) == 200 and not chain_keys & {synthetic.problem_key(_text(r)) for r in c_train}


@pytest.mark.parametrize("seed", [0, 1, 2, 3, 4])
def test_the_embedded_default_holds_out_every_verifiable_problem_in_every_seed(seed):
    from tasks.config.pipeline import PipelineConfig

    config = PipelineConfig.model_validate(yaml.safe_load(CONFIG.read_text())).with_seed(seed)
    data = prepare_datasets(config.data)
    held = [r for r in data.eval if canonical_problem(_text(r)) is not None]
    assert {r["source"] for r in held} == {"chain", "countdown", "countdown_transfer"}
    wanted = config.data.num_eval + config.data.countdown.num_eval + config.data.countdown.transfer_num_eval
    assert len(held) == wanted and len({canonical_problem(_text(r)) for r in held}) == wanted  # distinct problems
    assert held_out_overlap(held, {"train": data.train, "cold-start": data.cold_start, "pretraining": data.pretrain}) == []
    transfer = [r for r in data.eval if r["source"] == "countdown_transfer"]
    assert all(len(countdown.parse_prompt(_text(r))[0]) == 4 for r in transfer)
    assert max(n for r in data.train if r["source"] == "countdown" for n in countdown.parse_prompt(_text(r))[0]) == 12


def test_prepare_fails_when_a_training_source_holds_a_held_out_problem(tmp_path):
    """An eval source of the user's own spelling a problem the built-in countdown trains on (reordered)."""
    from grpo_core.config import DataConfig

    base = DataConfig(builtin_task=None, countdown={"num_train": 300, "num_eval": 20, "cold_start_size": 50,
                                                    "transfer_num_eval": 0})
    train = prepare_datasets(base).train
    numbers, target = countdown.parse_prompt(_text(train[0]))
    leaked = tmp_path / "eval.jsonl"
    leaked.write_text('{"prompt": "%s", "answer": "%d"}\n' % (countdown.format_prompt(numbers[::-1], target), target))
    config = DataConfig(builtin_task=None, countdown={"num_train": 300, "num_eval": 20, "cold_start_size": 50,
                                                      "transfer_num_eval": 0},
                        eval_sources=[{"path": str(leaked)}], decontaminate=False)
    with pytest.raises(DataError, match="training rows hold a held-out problem"):
        prepare_datasets(config)


def test_a_config_whose_evaluation_would_not_score_the_countdown_sources_fails_at_load():
    from tasks.config.pipeline import PipelineConfig

    raw = yaml.safe_load(CONFIG.read_text())
    raw["evaluate"]["source_rewards"] = {"countdown": "countdown_accuracy"}
    with pytest.raises(ValueError, match=r"\['countdown_transfer'\].*countdown_transfer: countdown_accuracy"):
        PipelineConfig.model_validate(raw)
    raw["data"]["countdown"]["transfer_num_eval"] = 0
    assert PipelineConfig.model_validate(raw).data.countdown.transfer_num_eval == 0
