"""Measuring a model: held-out accuracy and the seed's response features (``heldout``), R1's benchmark
protocol (``benchmarks``: pass@k / maj@k over sampled answers, ``passk``) and the "emergence" table's
features (``emergence``: reflection and backtracking phrases, length, direct answers), and on a task with tries
whether reflection is checking that pays (``checking``: a miss checked and retried, a hit stopped on).
"""
