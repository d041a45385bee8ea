"""A study's results folder, `results/<study>/`: what a search writes there, what report and export
read back, and how any command finds it. The one place its layout is known.

- `summary.json`: `schema_version` (the folder's layout: autofit/results/schema.py lists those
  older autofits wrote, and reading migrates them to today's), study, model, gpu, backend, space,
  margin, budget, host budget (`host_budget_bytes`, null when not stated, and beside a stated
  one `host_budget_basis`, where it came from), probe counts, wall
  time, the best run and the Pareto front (each run with `config` holding every knob as applied,
  its GPU and host peaks), and every combination with its status (`Status`) and largest fitting
  batch or why it has none; `files`, the rows each table beside it holds (a reader tells a whole
  table from a cut one), and `overrides`, the search's settings as the user gave them (but out=,
  study= and storage=, which the summary keeps on their own), and `rerun`, the `autofit search`
  line that writes the folder again;
- `trials.csv`: every probe (its outcome, an `Outcome`) and every pruned or invalid combination
  (its `Status`), one row each, the searched knobs between `batch_size` and `peak_gib`, the host
  peak and budget after `budget_bytes` (a study written before host memory was counted has no
  such columns: read as not counted);
- `pareto.csv`: the Pareto front, the rows `autofit search` prints and `point=N` counts;
- `best.yaml`: the best run as `autofit probe` overrides, with a header saying what it is.

The four are written together (autofit/paths.py write_together): temporaries first, then renamed
into place with `summary.json`, the folder's commit marker, removed first and renamed last, so a
`summary.json` only ever stands beside the files of its own write. Reading checks the folder whole
(`check_folder`) and names a damaged file and the search that rewrites it in one line.

Reading needs nothing but the standard library: report and export never open the Optuna study.
"""

from autofit.results.layout import (
    BEST,
    PARETO,
    RESULTS,
    SUMMARY,
    TRIALS,
    check_study_name,
    study_folder,
)
from autofit.results.locate import locate, studies_under
from autofit.results.read import (
    Damaged,
    Probe,
    Study,
    check_folder,
    knobs_key,
    load_study,
    read_summary,
)
from autofit.results.write import point, probe_words, rerun_command, write_results

__all__ = [
    "BEST",
    "PARETO",
    "RESULTS",
    "SUMMARY",
    "TRIALS",
    "Damaged",
    "Probe",
    "Study",
    "check_folder",
    "check_study_name",
    "knobs_key",
    "load_study",
    "locate",
    "point",
    "read_summary",
    "probe_words",
    "rerun_command",
    "studies_under",
    "study_folder",
    "write_results",
]
