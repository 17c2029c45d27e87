"""What measures: the device's identity, the steps built from real models, the plan of what to
time, the timing itself, its order and passes, and the profile's rows (profile.csv)."""
