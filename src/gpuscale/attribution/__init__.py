"""Who uses which GPU: kubelet allocations, /proc PID owners and the node pod cache,
combined by pure rules into per-pod usage."""
