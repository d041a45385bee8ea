"""Calibration: the simulator held against real probes of the same configurations."""
