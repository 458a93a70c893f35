"""The live closed loop behind ``gpuscale demo``: world (the simulated replicas and nodes),
view (the screen) and loop (KEDA and the HPA over gRPC, driving the world)."""
