"""dreams_nas.nas: the search and the commands.

Rooms: `search/` (model-free: candidates, expected speedup, Pareto, strategies, Optuna study),
`stages/` (one library call per command), `cli.py` + `commands/` (argparse only).
"""
