"""``gpuscale simulate``: replay traffic through KEDA, the HPA and a scaling policy, for
gpuscale's profiles and planner (through the scaler's own answer code) and the autoscalers
people run today; the fluid lower bound; the plot."""
