"""pass@k and maj@k (cons@k) from n sampled answers per problem: the R1 paper's evaluation numbers.

pass@k (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", eq. 1): with n samples of
which c are correct, the unbiased estimate of "at least one of k samples is correct" is
``1 - C(n-c, k) / C(n, k)``. Binomials overflow for n in the hundreds, so ``pass_at_k`` uses the
numerically stable product form of the same paper's reference code:
``C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i)``. pass@1 is then c / n, the mean correctness
the R1 paper reports as pass@1 (DeepSeek-R1, section 3.1).

maj@k (the R1 paper's cons@64): the answer most of k samples agree on, scored once. Answers are grouped
by equivalence (``equivalent(a, b)``: math-verify for math, see ``grpo_core.evaluation.benchmarks``), not by string, so
``0.5`` and ``\\frac{1}{2}`` vote together. Rules, stated once here:

- Grouping: samples are taken in order; each joins the first existing group whose representative (its
  first member) it is equivalent to, else starts a new group.
- Ties: among groups with the most votes, the one whose first member comes first wins.
- A sample with no extracted answer (``None``) does not vote; a block where no sample has an answer
  scores 0.
- The winning group scores its representative's correctness.
- With n > k samples, maj@k is the mean over the ``n // k`` disjoint blocks of k consecutive samples
  (samples are i.i.d., so each block is a draw of k; averaging lowers the variance). With k = n it is one
  vote over all samples.
"""

from __future__ import annotations

from typing import Callable, Sequence, TypeVar

A = TypeVar("A")
Equivalent = Callable[[A, A], bool]


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``n`` samples with ``c`` correct: ``1 - C(n-c, k) / C(n, k)`` (product form)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n; got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a correct sample
        return 1.0
    fail = 1.0
    for i in range(n - c + 1, n + 1):
        fail *= 1.0 - k / i
    return 1.0 - fail


def group_answers(answers: Sequence[A | None], equivalent: Equivalent) -> list[list[int]]:
    """Indices of ``answers`` grouped by ``equivalent`` (module docstring's grouping rule); ``None`` skipped.
    Groups come in order of their first member."""
    groups: list[list[int]] = []
    for i, answer in enumerate(answers):
        if answer is None:
            continue
        for group in groups:
            if equivalent(answers[group[0]], answer):
                group.append(i)
                break
        else:
            groups.append([i])
    return groups


def majority_vote(answers: Sequence[A | None], equivalent: Equivalent) -> int | None:
    """Index of the sample whose answer wins the vote (the first member of the largest group; ties go to the
    group whose first member comes first); ``None`` when no sample has an answer."""
    groups = group_answers(answers, equivalent)
    if not groups:
        return None
    best = max(groups, key=len)  # max keeps the first of equal sizes: the earliest group wins ties
    return best[0]


def maj_at_k(answers: Sequence[A | None], correct: Sequence[bool], k: int, equivalent: Equivalent) -> float:
    """maj@k of one problem's n samples: mean over the ``n // k`` blocks of k consecutive samples of the
    majority answer's correctness (module docstring)."""
    n = len(answers)
    if len(correct) != n:
        raise ValueError(f"{n} answers but {len(correct)} correctness flags")
    if not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n; got n={n}, k={k}")
    scores = []
    for start in range(0, n - n % k, k):
        winner = majority_vote(answers[start: start + k], equivalent)
        scores.append(0.0 if winner is None else float(bool(correct[start + winner])))
    return sum(scores) / len(scores)
