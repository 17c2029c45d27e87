"""What every other room builds on, with no torch import: errors, `SubnetSpec` and
`SearchSpace`, the run folder, atomic files, device resolution, versions, progress bars."""
