"""One library call per command: train, profile, score, search (with verify and export), demo,
and what they read from the run folder (inputs)."""
