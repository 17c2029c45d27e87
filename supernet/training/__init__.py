"""Training the supernet: what to train and how (`recipe.SupernetRecipe`, `config.TrainConfig`),
self-distillation data, AIFD, features and their store, batching and the loss, the training-time
unroll, the step schedule, head sorting, two-phase progressive training (TPPT) and the recipe
that runs them into a run folder."""
