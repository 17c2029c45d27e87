"""dreams_nas.latency: hardware identity, timing, the profile store and the latency predictor."""
