"""The live loop's defaults, importable without the loop (the CLI's help text uses them)."""

GPUS_PER_NODE = 8  # simulated 8x H100 nodes
DEFAULT_SPEED = 40.0  # the loop's fast-forward: a simulated hour in 90 s
DEFAULT_RATE = 30.0  # requests/s at the pattern's busiest (about 6 replicas)
DEFAULT_DURATION = 3600.0  # simulated seconds: one compressed day-night cycle
