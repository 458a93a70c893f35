"""What the scaler holds in memory: the fleet view, the planners (the plan book), push
subscriptions and the bounded history. Changed by streams and loops; read without I/O."""
