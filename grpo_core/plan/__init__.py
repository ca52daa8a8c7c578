"""Will it fit? Memory and time estimates for a config on a given GPU (``memory``), the reward models and
judges a stage loads beside its policy (``scorers``), and model shapes read from config.json (``shapes``).
"""
