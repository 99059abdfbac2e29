"""Shared test material: the reference models (models.py) that tests, the demo and benchmarks use."""
