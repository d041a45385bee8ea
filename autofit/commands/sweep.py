"""`autofit <command> -m key=a,b ...`: a Hydra multirun, one command run per combination of the
comma-separated values, through whichever Hydra launcher is chosen (`hydra/launcher=...`): the
basic one runs them one after another here, a cluster launcher sends them to the cluster.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from autofit.config import validate_overrides
from autofit.errors import AutofitError
from autofit.paths import conf_dir


def sweep(command: str, overrides: list[str], task: Callable[[Any], int]) -> int:
    """Run `task` on every configuration the sweep composes; non-zero if any run failed."""
    import hydra

    overrides = validate_overrides(command, overrides)  # a GPU file becomes its stored name
    failures: list[str] = []

    def job(cfg: Any) -> None:
        from hydra.core.hydra_config import HydraConfig

        try:
            code = task(cfg)
        except AutofitError as exc:
            print(f"autofit: error: {exc}", file=sys.stderr)
            code = exc.exit_code
        if code:
            failures.append(" ".join(HydraConfig.get().overrides.task) or "the default run")

    main = hydra.main(config_path=str(conf_dir()), config_name=command, version_base="1.3")(job)
    argv = sys.argv
    sys.argv = [
        f"autofit {command}",
        "--multirun",
        *overrides,
        "hydra.sweep.dir=results/multirun/${now:%Y-%m-%d_%H-%M-%S}",
        "hydra/job_logging=none",
        "hydra/hydra_logging=none",
    ]
    try:
        main()
    finally:
        sys.argv = argv
    if failures:
        print(
            f"autofit: {len(failures)} run(s) of the sweep failed: {', '.join(failures)}",
            file=sys.stderr,
        )
        return 1
    return 0
