"""`autofit report`: a finished study's answer, as tables, charts and an HTML page; with
`compare=`, what changed against another study, exiting 1 on a regression. Two studies of
different models or GPUs are compared with a warning, or refused with `strict=true`."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from autofit.config import compose_config
from autofit.errors import AutofitError, ConfigError
from autofit.paths import ensure_writable, write_atomically, write_together
from autofit.report import tables
from autofit.report.answer import answer
from autofit.report.changes import compare
from autofit.report.html import write_page
from autofit.report.plots import write_pngs
from autofit.results import load_study, locate
from autofit.settings import FLAG, TEXT, built, number, setting


@dataclasses.dataclass(frozen=True)
class ReportSettings:
    """`autofit report`'s settings, each with its rule; conf/report.yaml gives the defaults and
    says what each means."""

    study: str | None = setting(None, TEXT.or_null())
    # `from` is a Python keyword: the field is `source`, the setting `from=`
    source: str | None = setting(None, TEXT.or_null(), key="from")
    compare: str | None = setting(None, TEXT.or_null())
    threshold: float = setting(
        0.10,
        number(lambda v: 0 <= v < 1, "expected a share between 0 and 1, e.g. 0.10 for 10%"),
    )
    strict: bool = setting(False, FLAG)
    out: str | None = setting(None, TEXT.or_null())


def run(overrides: list[str]) -> int:
    return run_config(compose_config("report", overrides))


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
    return report(built(ReportSettings, cfg))


def report(settings: ReportSettings) -> int:
    """The study's report, printed and written; with `compare=`, what changed against another
    study, and an error on a regression."""
    study = load_study(locate(settings.study, settings.source))
    baseline = (
        load_study(locate(settings.compare, None, setting="compare")) if settings.compare else None
    )
    unlike = _unlike(study, baseline, str(settings.compare)) if baseline is not None else None
    if unlike and settings.strict:  # before anything is written
        raise ConfigError(f"{unlike}; strict=true compares studies of one model on one GPU only")
    if unlike:
        print(f"autofit: warning: {unlike} (strict=true makes this an error)", file=sys.stderr)
    out = Path(settings.out) if settings.out else study.path / "report"
    unwritable = _unwritable(out, chosen=bool(settings.out))
    parts = tables.report_tables(study)
    text = "\n\n".join([answer(study).text(), tables.headline(study), *(t.text() for t in parts)])
    print(text)
    if unwritable is None:
        written = _write_report(study, parts, text, out)
        print(f"\nreport in {out}/ ({', '.join(written)})")
    comparison = compare(baseline, study, settings.threshold) if baseline is not None else None
    if comparison is not None:
        if unwritable is None:
            write_atomically(out / "compare.json", json.dumps(comparison.to_dict(), indent=2))
        print("\n" + "\n\n".join(t.text() for t in tables.comparison_tables(comparison)))
        if unwritable is None:
            print(f"\ncomparison in {out}/compare.json")
    if unwritable is not None:
        print(f"autofit: warning: {unwritable}", file=sys.stderr)
    if comparison is None:
        return 0
    return _verdict(comparison.regressions, baseline, settings.threshold)


def _unwritable(out: Path, chosen: bool) -> str | None:
    """Why the report's files cannot be written to `out` (None: they can). A folder the user
    chose (`chosen`) is theirs to fix: an error."""
    try:
        ensure_writable(out / "report.txt", what="report")
    except AutofitError as exc:
        if chosen:
            raise
        # A study read from a read-only place (a shared results folder, a mounted archive):
        # the answer is still printed; the files need a folder of the user's.
        return f"{exc}; add out=DIR to write the report's files (and compare.json) there"
    return None


def _verdict(regressions: list[str], baseline: Any, threshold: float) -> int:
    """The comparison's last line: no regression (0), or the first one as the error."""
    if regressions:
        more = (
            f" (and {len(regressions) - 1} more, listed in compare.json)"
            if len(regressions) > 1
            else ""
        )
        raise AutofitError(f"regression against {baseline.path}/: {regressions[0]}{more}")
    print(f"no regression against {baseline.path}/ (throughput threshold {threshold:.0%})")
    return 0
