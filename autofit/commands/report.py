"""`autofit report`: a finished study's answer, as tables, charts and an HTML page; with
`compare=`, what changed against another study, exiting 1 on a regression. Two studies of
different models or GPUs are compared with a warning, or refused with `strict=true`."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from autofit.config import compose_config
from autofit.errors import AutofitError, ConfigError, shown
from autofit.paths import ensure_writable, write_atomically, write_together


def run(overrides: list[str]) -> int:
    return run_config(compose_config("report", overrides))


def _threshold(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        raise ConfigError(
            f"threshold={shown(value)} is not valid; expected a share between 0 and 1, e.g. 0.10 for 10%"
        )
    return float(value)


def _strict(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ConfigError(f"strict={shown(value)} is not valid; expected true or false")
    return value


def _unlike(study: Any, baseline: Any, other: str) -> str | None:
    """How the study compared against differs in model or GPU, in words naming both; None when
    they are of one model on one GPU."""
    if all(study.summary.get(k) == baseline.summary.get(k) for k in ("model", "gpu")):
        return None

    def of(s: Any) -> str:
        return f"{s.summary.get('model')} on {s.summary.get('gpu')}"

    return (
        f"compare={other} is a study of {of(baseline)} and {study.name} one of {of(study)}: "
        "the comparison sets different runs side by side"
    )


def _write_report(study: Any, report: list[Any], text: str, out: Path) -> list[str]:
    """Write the report's files into `out` together (autofit/paths.py write_together): the
    charts and the page are drawn into a hidden folder beside them first, then all are renamed
    into place, report.txt last. A kill leaves the old report or the new one, whole."""
    import shutil
    import tempfile

    from autofit.report.html import write_page
    from autofit.report.plots import write_pngs

    staging = Path(tempfile.mkdtemp(dir=out, prefix=".report."))
    try:
        drawn = [*write_pngs(study, staging), write_page(study, report, staging / "report.html")]
        files: dict[str, str | bytes] = {p.name: p.read_bytes() for p in drawn}
        files["report.txt"] = text + "\n"
        write_together(out, files, marker="report.txt")
    except OSError as exc:
        raise AutofitError(f"cannot write the report to {out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return ["report.txt", *(p.name for p in drawn)]


def run_config(cfg: Any) -> int:
    """Report the study a composed `report` config names; compare it when asked."""
    from autofit.report import tables
    from autofit.report.answer import answer
    from autofit.results import load_study, locate

    # Hydra reads `study=2024` as a number: every name and path is taken as text.
    name, folder, other, out_dir = (
        None if cfg[k] is None else str(cfg[k]) for k in ("study", "from", "compare", "out")
    )
    threshold, strict = _threshold(cfg.threshold), _strict(cfg.strict)
    study = load_study(locate(name, folder))
    baseline = load_study(locate(other, None, setting="compare")) if other else None
    unlike = _unlike(study, baseline, str(other)) if baseline is not None else None
    if unlike and strict:  # before anything is written
        raise ConfigError(f"{unlike}; strict=true compares studies of one model on one GPU only")
    if unlike:
        print(f"autofit: warning: {unlike} (strict=true makes this an error)", file=sys.stderr)
    out = Path(out_dir) if out_dir else study.path / "report"
    unwritable = None
    try:
        ensure_writable(out / "report.txt", what="report")
    except AutofitError as exc:
        if out_dir:  # a folder the user chose: theirs to fix
            raise
        # A study read from a read-only place (a shared results folder, a mounted archive):
        # the answer is still printed; the files need a folder of the user's.
        unwritable = f"{exc}; add out=DIR to write the report's files (and compare.json) there"

    report = tables.report_tables(study)
    text = "\n\n".join([answer(study).text(), tables.headline(study), *(t.text() for t in report)])
    print(text)
    if unwritable is None:
        written = _write_report(study, report, text, out)
        print(f"\nreport in {out}/ ({', '.join(written)})")
    if baseline is not None:
        from autofit.report.changes import compare

        comparison = compare(baseline, study, threshold)
        if unwritable is None:
            write_atomically(out / "compare.json", json.dumps(comparison.to_dict(), indent=2))
        print("\n" + "\n\n".join(t.text() for t in tables.comparison_tables(comparison)))
        if unwritable is None:
            print(f"\ncomparison in {out}/compare.json")
    if unwritable is not None:
        print(f"autofit: warning: {unwritable}", file=sys.stderr)
    if baseline is None:
        return 0
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
