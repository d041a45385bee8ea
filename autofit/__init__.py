"""autofit: find the largest and fastest training run that fits in a GPU's memory."""

__version__ = "0.1.0"
