"""dreams_nas.reports: the Pareto HTML report and its figures (pure rendering)."""
