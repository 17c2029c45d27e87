"""dreams_nas.nas: expected speedup, exhaustive and Optuna search, Pareto front, export, the CLI."""
