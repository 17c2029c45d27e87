"""What models: the latency predictor fitted on a profile's rows (`predictor.LatencyPredictor`),
its parts (the draft steps' regression, the target steps' tables, the per-kind regressor,
validation) and the one query interface the search asks (`query.LatencyModel`)."""
