"""Models the project builds itself: the embedded default's tiny base (``tiny``, with its pretraining) and the
two-layer miniatures ``r1 check`` runs in place of a config's real models (``miniature``).
"""
