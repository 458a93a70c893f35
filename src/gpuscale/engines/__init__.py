"""Inference engines: scrape opted-in pods, parse their /metrics into per-pod signals."""
