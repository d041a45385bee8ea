"""Deliberately failing probe workers, run by tests/test_probe_runner.py as `python -m workers.X`."""
