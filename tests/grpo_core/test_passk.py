"""pass@k and maj@k against hand-computed cases (issue 11, must show 3)."""

from __future__ import annotations

from math import comb

import pytest

from grpo_core.evaluation.passk import group_answers, maj_at_k, majority_vote, pass_at_k


def same(a: str, b: str) -> bool:
    return a == b


@pytest.mark.parametrize("n, c, k, expected", [
    (4, 0, 1, 0.0),             # c = 0: never
    (4, 0, 4, 0.0),
    (4, 4, 1, 1.0),             # c = n: always
    (4, 4, 4, 1.0),
    (4, 1, 1, 0.25),            # pass@1 = c / n
    (16, 5, 1, 5 / 16),
    (4, 1, 4, 1.0),             # k = n: 1 if any sample is correct
    (4, 2, 2, 1 - 1 / 6),       # C(2,2)/C(4,2) = 1/6
    (5, 2, 3, 1 - 1 / 10),      # C(3,3)/C(5,3) = 1/10
    (10, 3, 4, 1 - 35 / 210),   # C(7,4)/C(10,4)
    (3, 1, 2, 1 - 1 / 3),       # C(2,2)/C(3,2) = 1/3
    (3, 2, 2, 1.0),             # n - c < k: every pair holds a correct one
])
def test_pass_at_k_hand_computed(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_the_binomial_formula_and_stays_finite_for_large_n():
    for n in (1, 7, 20):
        for c in range(n + 1):
            for k in range(1, n + 1):
                exact = 1 - comb(n - c, k) / comb(n, k)
                assert pass_at_k(n, c, k) == pytest.approx(exact, abs=1e-12)
    # C(1024, 512) overflows a float; the product form does not
    assert pass_at_k(1024, 3, 512) == pytest.approx(1 - comb(1021, 512) / comb(1024, 512), rel=1e-9)
    assert 0.0 <= pass_at_k(2048, 1, 64) <= 1.0


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_refuses_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_grouping_is_by_equivalence_not_by_string():
    def numeric(a: str, b: str) -> bool:
        return float(eval(a)) == float(eval(b))  # noqa: S307 - test data only

    assert group_answers(["1/2", "0.5", "2", None, "4/2", "3"], numeric) == [[0, 1], [2, 4], [5]]


def test_majority_vote_picks_the_largest_group():
    assert majority_vote(["3", "5", "5", "3", "5"], same) == 1  # "5" x3 beats "3" x2; its first member is 1


def test_tie_goes_to_the_group_whose_first_member_comes_first():
    assert majority_vote(["7", "9", "9", "7"], same) == 0   # 2 vs 2: "7" appears first
    assert majority_vote(["9", "7", "7", "9"], same) == 0   # 2 vs 2: "9" appears first
    assert majority_vote([None, "4", "6"], same) == 1       # 1 vs 1, None does not vote
    assert majority_vote([None, None], same) is None


def test_maj_at_k_hand_computed():
    answers = ["5", "3", "5", "3", "3", "3", "1", "2"]
    correct = [a == "5" for a in answers]
    assert maj_at_k(answers, correct, 8, same) == 0.0     # k = n: "3" x4 wins
    assert maj_at_k(answers, correct, 4, same) == 0.5     # [5,3,5,3] tie -> "5" (first) correct; [3,3,1,2] -> "3"
    assert maj_at_k(answers, correct, 2, same) == 0.5     # [5,3]->5 ok, [5,3]->5 ok, [3,3]->3, [1,2]->1
    assert maj_at_k(answers, correct, 1, same) == 0.25    # k = 1: mean correctness, as pass@1
    assert maj_at_k(answers, correct, 3, same) == 0.5     # [5,3,5]->5 ok, [3,3,3]->3; the last 2 samples unused


def test_maj_at_k_edges():
    assert maj_at_k(["1", "2", "1"], [False, False, False], 3, same) == 0.0   # c = 0
    assert maj_at_k(["1", "1", "1"], [True, True, True], 3, same) == 1.0      # c = n
    assert maj_at_k([None, None, "4"], [False, False, True], 3, same) == 1.0  # only answered samples vote
    assert maj_at_k([None, None], [False, False], 2, same) == 0.0             # nobody answered
    # the winner scores its first member's verdict, whatever later members scored
    assert maj_at_k(["x", "x"], [True, False], 2, same) == 1.0
    with pytest.raises(ValueError, match="1 <= k <= n"):
        maj_at_k(["1"], [True], 2, same)
