"""Measurement: llama.cpp through its backends, the harness, calibration, quality, load generation."""
