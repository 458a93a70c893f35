"""GPU readings: immutable samples, the NVML backend and the simulated backend."""
