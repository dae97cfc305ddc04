"""Predictions: memory (the VRAM triangle), work per token, device rates, speed, serving under load."""
