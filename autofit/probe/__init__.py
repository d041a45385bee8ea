"""Probes: one training configuration measured in its own subprocess (runner.py the parent,
worker.py the child; the records they pass are autofit/records/probe.py)."""
