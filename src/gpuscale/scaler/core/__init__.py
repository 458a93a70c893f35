"""The scaler's pure core: trigger metadata, label selectors, signals and profiles,
the HPA-correct aggregation, and the planner's algorithm. No state, no I/O."""
