"""The search, model-free: candidates and expected speedup, Pareto fronts, the exhaustive and
Optuna strategies, the study, claims between workers, the scoring cache, replay."""
