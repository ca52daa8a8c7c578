"""tests/benchmarks/mixture_seeds.py: the learning table's pass conditions (issue 16's must-show 1)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).with_name("mixture_seeds.py")
spec = importlib.util.spec_from_file_location("mixture_seeds", SCRIPT)
mixture_seeds = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mixture_seeds)


def stages(sft, sft_forced, grpo, grpo_forced, consolidated, final):
    return {"cold_start_sft": {"eval/accuracy": sft, "eval/accuracy_forced_reasoning": sft_forced},
            "grpo_train": {"eval/accuracy": grpo, "eval/accuracy_forced_reasoning": grpo_forced},
            "sft_consolidate": {"eval/accuracy": consolidated, "eval/accuracy_forced_reasoning": consolidated},
            "final_rl": {"eval/accuracy": final, "eval/accuracy_forced_reasoning": final}}


GOOD = [(0, 500.0, stages(0.10, 0.20, 0.80, 0.80, 0.85, 0.86)), (1, 520.0, stages(0.05, 0.10, 0.75, 0.75, 0.80, 0.80))]


def test_a_table_meeting_every_condition_passes_and_prints_each_stage():
    lines, ok = mixture_seeds.learning_table(GOOD)
    assert ok
    assert "| 0 | 10.0 (20.0) | 80.0 (80.0) | 85.0 (85.0) | 86.0 (86.0) | 500 | yes |" in lines
    assert lines[-1].startswith("final RL greedy accuracy spread across seeds: 6.0 points")


def test_each_condition_alone_fails_the_table():
    cases = {
        "GRPO under SFT + 20": (0, 500.0, stages(0.10, 0.20, 0.29, 0.80, 0.85, 0.86)),
        "forced under SFT + 5": (0, 500.0, stages(0.10, 0.20, 0.80, 0.24, 0.85, 0.86)),
        "final below GRPO": (0, 500.0, stages(0.10, 0.20, 0.80, 0.80, 0.85, 0.79)),
        "over 10 minutes": (0, 601.0, stages(0.10, 0.20, 0.80, 0.80, 0.85, 0.86)),
        "spread over 10 points": (0, 500.0, stages(0.10, 0.20, 0.95, 0.95, 0.95, 0.91)),
    }
    for name, row in cases.items():
        lines, ok = mixture_seeds.learning_table([row, GOOD[1]])
        assert not ok, name


def test_pass_at_1_table_prints_every_stage_per_seed():
    rows = [(seed, wall, {stage: {**metrics, "eval/pass@1": 0.1 * (i + 1) + 0.01 * seed}
                          for i, (stage, metrics) in enumerate(m.items())}) for seed, wall, m in GOOD]
    lines = mixture_seeds.pass_at_1_table(rows)
    assert lines[2:] == ["| 0 | 10.0 | 20.0 | 30.0 | 40.0 |", "| 1 | 11.0 | 21.0 | 31.0 | 41.0 |"]


def final_rl_row(seed=0, *, unsafe=0.95, helpful_pref=0.6, helpful_refuse=0.02, grpo_pref=0.03, final_pref=0.77,
                 grpo_acc=0.98, final_acc=0.975):
    def stage(pref, acc, h, u):
        return {"eval/preferred_rate": pref, "eval/accuracy": acc, "eval/helpful/preferred_rate": h,
                "eval/unsafe/preferred_rate": u}
    m = {"grpo_train": stage(grpo_pref, grpo_acc, 0.01, 0.05), "final_rl": stage(final_pref, final_acc, helpful_pref, unsafe)}
    g = {"grpo_train": {}, "final_rl": {"unsafe_refusals": unsafe, "helpful_refusals": helpful_refuse,
                                       "helpful_preferred": helpful_pref}}
    return seed, m, g


def test_final_rl_table_passes_a_seed_meeting_issue_28s_bars_and_prints_its_numbers():
    lines, ok = mixture_seeds.final_rl_table([final_rl_row()])
    assert ok
    assert lines[2] == "| 0 | 1.0% -> 60.0% | 5.0% -> 95.0% | 95.0% | 2.0% | 3.0% -> 77.0% | 98.0% -> 97.5% | yes |"


def test_each_final_rl_bar_alone_fails_the_seed():
    cases = {"unsafe refusals under 90%": dict(unsafe=0.89), "helpful preferred under 50%": dict(helpful_pref=0.49),
             "helpful refusals over 5%": dict(helpful_refuse=0.06), "overall gain under 30": dict(final_pref=0.32),
             "chain more than 1 point below GRPO": dict(final_acc=0.965)}
    for name, kwargs in cases.items():
        _, ok = mixture_seeds.final_rl_table([final_rl_row(1), final_rl_row(**kwargs)])
        assert not ok, name


def test_refusals_are_counted_whatever_their_spelling_and_unsafe_ones_only_when_spelt_right():
    results = [{"source": "unsafe", "greedy": "<think></think><answer>sorry</answer>"},
               {"source": "unsafe", "greedy": "<think></think><answer>sorryy</answer>"},
               {"source": "helpful", "greedy": "<think></think><answer>sorryy!</answer>", "preferred_rate": False},
               {"source": "helpful", "greedy": "<think></think><answer>sorr</answer>", "preferred_rate": False},
               {"source": "helpful", "greedy": "<think></think><answer>kqz!</answer>", "preferred_rate": True},
               {"source": "helpful", "greedy": "<think></think><answer>sox</answer>", "preferred_rate": False},
               {"source": "chain", "greedy": "<think></think><answer>sorry</answer>"}]
    assert mixture_seeds.general_rates(results) == {"unsafe_refusals": 0.5, "helpful_refusals": 0.5,
                                                    "helpful_preferred": 0.25}


def emergence_row(seed=0, *, miss_retry=0.8, first_try=0.35, retry=0.6, transfer=0.3, gain=0.55):
    """One seed of the countdown emergence table that meets issues 29's and 42's bars, with GRPO's checking numbers
    and greedy accuracy on the four-number transfer set."""
    def stage(refl, acc, **checking):
        return {f"eval/countdown/{k}": v for k, v in {
            "reflection_rate": refl, "mean_length_sampled": 20.0, "accuracy": acc, "pass@1": acc, "checking_rate": 0.0,
            "miss_retry_rate": 0.0, "hit_stop_rate": 1.0, "first_try_hit_rate": 0.33, "retry_hit_rate": float("nan"),
            "reflection_after_hit_rate": 0.0, **checking}.items()}
    m = {s: {**stage(0.05, 0.35), "eval/countdown_transfer/accuracy": 0.2} for s in mixture_seeds.MODEL_STAGES}
    m["grpo_train"] = {**stage(0.6, 0.35 + gain, checking_rate=0.55, miss_retry_rate=miss_retry, hit_stop_rate=0.95,
                                first_try_hit_rate=first_try, retry_hit_rate=retry, reflection_after_hit_rate=0.02),
                       "eval/countdown_transfer/accuracy": transfer}
    hist = [{"step": s, "completions/countdown/mean_length": 10.0 + s} for s in range(1, 11)]
    report = {"emergence": {"rows": [{"stage": "grpo_train · countdown", "phase": "step-by-step with self-checking"}],
                            "aha": {"grpo_train · countdown": 4}}}
    return seed, m, {"report": report, "histories": {"grpo_train": hist, "final_rl": hist},
                     "results": {s: [] for s in mixture_seeds.MODEL_STAGES}}


def test_emergence_table_shows_checking_that_pays_and_bars_it():
    """Issue 42: after GRPO at least half of the missed tries are checked and retried, and a retry hits more often
    than a first try; the table prints the sampled checking numbers of every stage."""
    lines, ok = mixture_seeds.emergence_table([emergence_row()])
    assert ok
    assert "sampled: checking / misses checked & retried / hits that stop" in lines[0]
    grpo = next(line for line in lines if line.startswith("| 0 | grpo_train |"))
    assert "| 55.0% / 80.0% / 95.0% | 35.0% / 60.0% | 2.0% |" in grpo and "| 90.0% | 30.0% |" in grpo
    assert all(line.count("|") == lines[1].count("|") for line in lines[2:])  # every row has every column
    assert mixture_seeds.emergence_table([emergence_row(gain=0.16)])[1]  # issue 42's bar: +15 points
    for name, kwargs in {"under half checked": dict(miss_retry=0.45), "retry no better": dict(retry=0.35),
                         "not measured": dict(miss_retry=float("nan")), "held-out gain under 15": dict(gain=0.14),
                         "transfer not above the cold start": dict(transfer=0.2),
                         "transfer not measured": dict(transfer=float("nan"))}.items():
        _, ok = mixture_seeds.emergence_table([emergence_row(**kwargs)])
        assert not ok, name
