"""`autofit report`: a finished study's answer, as tables, charts and an HTML page; with
`compare=`, what changed against another study, exiting 1 on a regression."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from autofit.config import compose_config
from autofit.errors import AutofitError, ConfigError
from autofit.paths import ensure_writable


def run(overrides: list[str]) -> int:
    return run_config(compose_config("report", overrides))


def _threshold(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(
            f"threshold={value!r} is not valid; expected a share between 0 and 1, e.g. 0.10 for 10%"
        )
    return float(value)


def run_config(cfg: Any) -> int:
    """Report the study a composed `report` config names; compare it when asked."""
    from autofit.report import tables
    from autofit.results import load_study, locate

    # Hydra reads `study=2024` as a number: every name and path is taken as text.
    name, folder, other, out_dir = (
        None if cfg[k] is None else str(cfg[k]) for k in ("study", "from", "compare", "out")
    )
    threshold = _threshold(cfg.threshold)
    study = load_study(locate(name, folder))
    baseline = load_study(locate(other, None, setting="compare")) if other else None
    out = Path(out_dir) if out_dir else study.path / "report"
    ensure_writable(out / "report.txt", what="report")

    from autofit.report.html import write_page
    from autofit.report.plots import write_pngs

    report = tables.report_tables(study)
    text = "\n\n".join([tables.headline(study), *(t.text() for t in report)])
    print(text)
    (out / "report.txt").write_text(text + "\n")
    written = ["report.txt", *(p.name for p in write_pngs(study, out))]
    written.append(write_page(study, report, out / "report.html").name)
    print(f"\nreport in {out}/ ({', '.join(written)})")
    if baseline is None:
        return 0

    from autofit.report.changes import compare

    comparison = compare(baseline, study, threshold)
    (out / "compare.json").write_text(json.dumps(comparison.to_dict(), indent=2))
    print("\n" + "\n\n".join(t.text() for t in tables.comparison_tables(comparison)))
    print(f"\ncomparison in {out}/compare.json")
    regressions = comparison.regressions
    if regressions:
        more = (
            f" (and {len(regressions) - 1} more, listed in compare.json)"
            if len(regressions) > 1
            else ""
        )
        raise AutofitError(f"regression against {baseline.path}/: {regressions[0]}{more}")
    print(f"no regression against {baseline.path}/ (throughput threshold {threshold:.0%})")
    return 0
