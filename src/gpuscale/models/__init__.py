"""Pure models of what gpuscale sits in: the HPA's arithmetic, KEDA's loop for one
ScaledObject, an LLM serving replica, and the latency objective. No I/O; the scaler, the
simulator, the demo and the operator tools share them."""
