"""Training the supernet: self-distillation data, AIFD, features, batching, the training-time
unroll, two-phase progressive training (TPPT) and the recipe that runs them into a run folder."""
