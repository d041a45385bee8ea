"""The real worker, with a backend that raises an ordinary bug."""

from autofit.probe import worker


def broken(spec, backend):
    raise ValueError("a bug in a backend")


worker.measure = broken
raise SystemExit(worker.main())
