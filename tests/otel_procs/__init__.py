"""Processes for tests/test_otel.py: a producer and a worker, each with its own in-memory span exporter."""
