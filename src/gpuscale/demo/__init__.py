"""``gpuscale demo``: the closed loop (world: the simulated replicas and nodes; view: the
screen; loop: KEDA and the HPA over gRPC, driving the world) and a static scenario served
end to end (scenario)."""
