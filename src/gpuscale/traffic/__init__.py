"""Request traffic: trace readers, synthetic patterns, and load scaling - what every
simulation, demo and simulated GPU load replays."""
