"""The real worker, with a backend that reports the allocator setting its process started with."""

import os

from autofit.probe import worker


def report(spec, backend):
    raise RuntimeError(f"PYTORCH_CUDA_ALLOC_CONF={os.environ.get('PYTORCH_CUDA_ALLOC_CONF')!r}")


worker.measure = report
raise SystemExit(worker.main())
