"""What the scaler watches or polls beside the agents' streams: which pods must have
reported (rosters), which pods a ScaledObject scales (workloads), pending work with no pods
(demand sources)."""
