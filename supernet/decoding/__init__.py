"""Lossless speculative decoding: the loop, the accept/resample rules, the `Drafter` protocol,
the drafters and the registry that finds one by name or spec folder."""
