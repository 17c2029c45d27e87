"""Acceptance length tau of subnets: teacher-forced (temperature 0), sampled, and the
append-only table that caches the rows."""
