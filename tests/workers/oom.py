"""The real worker, with a backend whose step raises CUDA's out-of-memory exception."""

import torch

from autofit.probe import worker


def out_of_memory(spec, backend):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


worker.measure = out_of_memory
raise SystemExit(worker.main())
