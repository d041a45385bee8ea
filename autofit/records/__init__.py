"""The records every layer passes, on the ground floor: what goes into a probe and what comes
out (`ProbeSpec`, `ProbeResult`, `Outcome`: probe.py), what a backend measures (`Measurement`:
measurement.py), what the search made of a combination (`Status`: status.py) and the categories
of memory a step's tensors are counted in (categories.py). Torch-free, and importing nothing of
autofit above them (the GPU entry a spec carries is autofit/gpus.py's), so that the probe, the
backends, the search, the results and the reports share them without importing one another.
"""
