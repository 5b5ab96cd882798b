"""Deterministic synthetic datasets for the embedded demos and the tests."""
