"""`autofit search`: the largest and fastest run that fits, every probe in an Optuna study."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from autofit.calibration.margins import chosen_margin, classes_spanned
from autofit.command_line import key_of
from autofit.config import compose_config
from autofit.errors import AutofitError, ConfigError, Interrupted, NothingToSearch, shown
from autofit.host import budget_words, check_host_memory
from autofit.host import host_budget as host_budget_of
from autofit.probe.build import check_custom, check_settings, gpu_from_config, preset_from_config
from autofit.records.probe import Outcome
from autofit.search.progress import Progress
from autofit.search.retry import PATIENCE_S, StorageError, StorageUnavailable
from autofit.search.space import SearchSpace
from autofit.units import many, resolution_words, size, value

# Simulated probes are single-threaded Python: one per core keeps both busy.
MAX_DEFAULT_JOBS = 4


def study_and_folder(data: dict[str, Any], preset: Any, gpu: Any, space: Any) -> tuple[str, Path]:
    """The study a search config names (`study=`, else `<model>-<gpu>-<space>[-<trainer>]`) and
    the folder its files go to (`out=`, else results/<study>/)."""
    from autofit.results import check_study_name, study_folder

    trainer = data.get("trainer")
    default_name = f"{preset.label}-{gpu.label}-{space.name}" + (f"-{trainer}" if trainer else "")
    # A name, not a path (results.check_study_name): out= chooses a folder. Hydra reads
    # `study=2024` as a number, so the name is taken as text.
    named = data.get("study")
    study_name = check_study_name(str(named)) if named is not None else default_name
    return study_name, Path(data["out"]) if data.get("out") else study_folder(study_name)


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _default_jobs(backend: str) -> int:
    return 1 if backend == "cuda" else max(1, min(MAX_DEFAULT_JOBS, os.cpu_count() or 1))


def run(overrides: list[str]) -> int:
    return run_config(compose_config("search", overrides), overrides)


def run_config(cfg: Any, given: list[str] | None = None) -> int:
    """Run the search a composed `search` config describes; print it; write its files. `given`:
    the overrides as the user typed them (a sweep's job: Hydra's record of its own), which the
    `rerun` line repeats."""
    from omegaconf import OmegaConf

    data = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(data, dict)
    return _run_settings(data, given, set())


def next_search(data: dict[str, Any], space: str) -> dict[str, Any]:
    """The settings of the search `if_nothing_fits` starts: the same but the space, and a study
    and folder of its own where the user named them (study=NAME-<space>, out=FOLDER-<space>);
    unnamed, they follow from the space as any search's do."""
    stem = Path(space).stem
    return {
        **data,
        "space": space,
        "study": f"{data['study']}-{stem}" if data.get("study") is not None else None,
        "out": f"{data['out']}-{stem}" if data.get("out") else None,
    }


def _run_settings(data: dict[str, Any], given: list[str] | None, tried: set[str]) -> int:
    """The search of `data` (run_config's settings); where nothing fits and its space names
    another to search (`if_nothing_fits`), that search next, once per space (`tried`)."""
    from autofit.backends import resolve
    from autofit.search.space import load_space

    preset, gpu = preset_from_config(data["model"]), gpu_from_config(data["gpu"])
    check_settings(data["backend"], data["margin"], data["timeout_s"])
    check_host_memory(data.get("host_memory_gib"))
    space = load_space(str(data["space"]), preset)
    trainer = data.get("trainer")
    chosen, stack, in_place, space = _for_trainer(trainer, preset, space)
    margin = chosen_margin(
        data["margin"], preset.family, classes_spanned(preset.family, space.knobs)
    )
    budget = gpu.budget_bytes(margin.value)
    space = _with_target(data.get("target") or {}, preset, space)
    jobs, retry_failed, grace, patience = _worker_settings(data)

    left_out = left_out_by(space, gpu, chosen, preset)
    # Before any folder or study is made: a backend that cannot run here, a model that fails.
    backend = resolve(data["backend"], gpu, budget)
    check_custom(preset, data["timeout_s"])

    study_name, out = study_and_folder(data, preset, gpu, space)
    storage = _prepared_storage(data.get("storage"), out)

    host_setting = check_host_memory(data.get("host_memory_gib"))
    host_budget, basis = host_budget_of(host_setting, backend, gpu)
    meta = {"study": study_name, "model": preset.name, "gpu": gpu.name, "backend": backend, "space": space.name,
            "margin": margin.value, "margin_basis": margin.basis, "host_budget_bytes": host_budget,
            "storage": storage}  # fmt: skip
    if basis is not None:  # written where there is a budget to explain (schema.py)
        meta["host_budget_basis"] = basis
    if trainer:
        meta["trainer"] = trainer
        meta["trainer_stack"] = stack
        if in_place:
            meta["trainer_values"] = {k: list(v) for k, v in in_place.items()}
    # Every setting as the user gave it, but where the folder and the study are: the `rerun`
    # line and the probe lines printed for the user repeat them (autofit/results/write.py).
    given = _job_overrides() if given is None else given
    if given is not None:
        meta["overrides"] = [o for o in given if key_of(o) not in ("out", "study", "storage")]
    checked = _Checked(
        meta, space, preset, gpu, backend, margin.value, data["timeout_s"], host_budget,
        left_out, out, jobs or _default_jobs(backend), retry_failed, grace, patience,
    )  # fmt: skip
    try:
        return _search(checked)
    except StorageError as exc:
        raise type(exc)(f"{exc}; {_resume_words(exc, meta, out)}") from None
    except (NothingFits, NothingToSearch) as exc:
        # Nothing fits, or nothing here is a run this card or trainer can launch: the space
        # names where to look next.
        if space.if_nothing_fits is None or Path(space.if_nothing_fits).stem in tried:
            raise
        return _go_on(exc, space, data, given, tried)


def _go_on(
    exc: AutofitError, space: SearchSpace, data: dict[str, Any], given: list[str] | None,
    tried: set[str],
) -> int:  # fmt: skip
    """Where `space` has no run (`exc` says why), the search of the space it names next."""
    following = space.if_nothing_fits
    assert following is not None
    print(
        f"\n{exc}\n\nsearching space {following} next, where space {space.name} has no run "
        "(its if_nothing_fits)\n",
        flush=True,
    )
    if given is not None:
        given = [o for o in given if key_of(o) not in ("space", "study", "out")]
        given.append(f"space={following}")
    try:
        return _run_settings(next_search(data, following), given, tried | {space.name})
    except NothingToSearch as none:
        raise NothingFits(f"{exc}; space {following}, searched next, has no run: {none}") from None


def _for_trainer(
    trainer: Any, preset: Any, space: SearchSpace
) -> tuple[Any, dict[str, Any], dict[str, tuple[Any, ...]], SearchSpace]:
    """The target `trainer=` names (None without one), the values it runs of the knobs it
    decides itself (`trainer_stack`), the values it runs of knobs where it runs none the space
    gives (`trainer_values`), and the space with both in place for every trial."""
    if trainer is None:
        return None, {}, {}, space
    from autofit.export import target, trainer_stack, trainer_values

    chosen = target(trainer, setting="trainer")
    chosen.check_family(preset, setting="trainer")
    values = trainer_values(chosen, preset, space.knobs)
    searched = {**space.knobs, **values}
    stack = trainer_stack(chosen, preset, searched)
    fixed = {**searched, **{k: (v,) for k, v in stack.items()}}
    return chosen, stack, values, dataclasses.replace(space, knobs=fixed)


def _with_target(target: dict[str, Any], preset: Any, space: SearchSpace) -> SearchSpace:
    """The space with the `target.` settings checked and in place (the resolution the best is
    chosen at, the least batch it may have, the best rule's tolerances)."""
    if target.get("resolution") is not None:
        preset.check_resolution(target["resolution"])
        if target["resolution"] not in space.resolutions:
            raise ConfigError(
                f"target.resolution={target['resolution']} is not searched by space {space.name}; "
                f"its resolutions: {', '.join(map(str, space.resolutions))}"
            )
        space = dataclasses.replace(space, target_resolution=target["resolution"])
    if target.get("min_batch") is not None:
        if not isinstance(target["min_batch"], int) or target["min_batch"] < 1:
            raise ConfigError(
                f"target.min_batch={shown(target['min_batch'])} is not valid; expected an integer >= 1"
            )
        space = dataclasses.replace(space, target_min_batch=target["min_batch"])
    space = dataclasses.replace(space, best_rule=space.best_rule.replaced(target, "target."))
    if space.target_min_batch > space.max_batch:  # no run could be the best: say so, probe nothing
        raise ConfigError(
            f"target.min_batch={space.target_min_batch} is above space {space.name}'s largest "
            f"batch, {space.max_batch}; valid: 1 to {space.max_batch}"
        )
    return space


def _worker_settings(data: dict[str, Any]) -> tuple[int | None, bool, float, float]:
    """`jobs`, `retry_failed`, `claim_grace_s` and `storage_patience_s`, each checked."""
    jobs = data.get("jobs")
    if jobs is not None and (not isinstance(jobs, int) or jobs < 1):
        raise ConfigError(f"jobs={shown(jobs)} is not valid; expected an integer >= 1")
    retry_failed, grace = data.get("retry_failed", True), data.get("claim_grace_s", 60)
    if not isinstance(retry_failed, bool):
        raise ConfigError(
            f"retry_failed={shown(retry_failed)} is not valid; expected true or false"
        )
    if isinstance(grace, bool) or not isinstance(grace, (int, float)) or grace <= 0:
        raise ConfigError(f"claim_grace_s={shown(grace)} is not valid; expected seconds > 0")
    patience = data.get("storage_patience_s", PATIENCE_S)
    if isinstance(patience, bool) or not isinstance(patience, (int, float)) or patience < 0:
        raise ConfigError(
            f"storage_patience_s={shown(patience)} is not valid; expected seconds >= 0"
        )
    return jobs, retry_failed, float(grace), float(patience)


def _prepared_storage(given: str | None, out: Path) -> str:
    """The study storage's URL (`storage=`, else results/studies.db), checked and writable,
    before anything is probed: the results folder `out` and a SQLite file's folder."""
    from autofit.paths import ensure_writable
    from autofit.search.recorder import default_storage
    from autofit.search.storage import check_url, storage_file

    storage = given or default_storage(Path("results"))
    check_url(storage)  # before any folder is made
    ensure_writable(out / "summary.json")
    file = storage_file(storage)
    if file is not None:
        if not file.parent.exists() and not _inside(file.parent, Path.cwd()):
            # `sqlite:////results/x.db` (four slashes: an absolute path) makes /results: say so
            print(
                f"autofit: note: making {file.parent.resolve()} for storage={storage}: it is "
                "outside this folder (sqlite:///PATH is relative, sqlite:////PATH absolute)",
                file=sys.stderr,
            )
        ensure_writable(file, "study storage")
    return storage


@dataclasses.dataclass(frozen=True)
class _Checked:
    """A search's settings, each checked: what `_search` runs."""

    meta: dict[str, Any]  # what the study and summary.json record of the search
    space: SearchSpace
    preset: Any
    gpu: Any
    backend: str
    margin: float
    timeout_s: float
    host_budget: int | None
    left_out: Any
    out: Path
    jobs: int
    retry_failed: bool
    grace_s: float
    patience_s: float


def _job_overrides() -> list[str] | None:
    """A sweep job's overrides, as Hydra recorded them (none outside a Hydra job)."""
    from hydra.core.hydra_config import HydraConfig

    from autofit.config import as_given

    if not HydraConfig.initialized():
        return None
    return as_given(list(HydraConfig.get().overrides.task))


def _resume_words(exc: StorageError, meta: dict[str, Any], out: Path) -> str:
    """What the user does after the storage failed, and the command that resumes the search."""
    from autofit.results import rerun_command

    command = rerun_command(meta, out)
    if isinstance(exc, StorageUnavailable):
        return f"every probe that finished before is kept there; rerun `{command}` once it is back"
    return f"rerun `{command}` once that is mended, or with another storage="


def _search(run: _Checked) -> int:
    """The search itself, once every setting is checked: probes, files, the printed answer."""
    from autofit.probe.launcher import launcher_for
    from autofit.probe.libraries import libraries_of
    from autofit.report.tables import pareto_table
    from autofit.results import load_study, write_results
    from autofit.search import display
    from autofit.search.engine import Search
    from autofit.search.prober import Prober
    from autofit.search.recorder import StudyRecorder

    meta, space, preset, gpu, backend = run.meta, run.space, run.preset, run.gpu, run.backend
    study_name, host_budget, knob_names = meta["study"], run.host_budget, list(space.knobs)
    recorder = StudyRecorder(
        meta["storage"], study_name, {k: v for k, v in meta.items() if k != "storage"},
        retry_failed=run.retry_failed, claim_grace_s=run.grace_s, patience_s=run.patience_s,
    )  # fmt: skip
    progress = Progress(sys.stderr, space, knob_names, unit=preset.unit)
    print(_start_line(run), flush=True)
    try:
        uses = libraries_of(preset.family, space.knobs)  # the fork server leaves out the rest
        with launcher_for(backend, preset.family, uses) as launcher:
            prober = Prober(
                preset, gpu, backend, run.margin, run.timeout_s, recorder, launcher, host_budget
            )  # fmt: skip
            try:
                result = Search(
                    space, prober, jobs=run.jobs, listener=progress, left_out=run.left_out
                ).run()  # fmt: skip
            finally:
                prober.close()
    except Interrupted as exc:  # the launcher's exit has ended every probe; say what is kept
        recorder.close()  # the writes in flight end first: the count is what the study holds
        unsettled = (
            f" ({many(recorder.unsettled, 'write')} of more still under way as it stopped)"
            if recorder.unsettled
            else ""
        )
        exc.note = (
            f"{many(recorder.recorded, 'probe')} finished here, stored in study {study_name}"
            f"{unsettled}; rerun the same command to resume"
        )
        raise
    finally:
        recorder.close()  # gives back the claims of probes that did not finish
        progress.close()
    counts = {"budget_bytes": result.budget_bytes, "n_probes": result.new_probes + result.reused_probes,
              "new_probes": result.new_probes, "reused_probes": result.reused_probes,
              "wall_s": round(result.wall_s, 2)}  # fmt: skip
    front = [r for runs in result.pareto.values() for r in runs]
    summary = write_results(
        run.out, meta, result.results, result.combinations, front, result.best, counts, knob_names,
        result.fastest, space.best_rule, preset,
    )  # fmt: skip
    # The same table `autofit report` prints, from the files just written.
    print("\n" + pareto_table(load_study(run.out)).text())
    lost = display.losers(result.combinations)
    if lost:
        print(f"\nnot on the front:\n{lost}")
    print(
        f"\n{many(summary['n_probes'], 'probe')} ({result.new_probes} run, {result.reused_probes} reused) "
        f"in {result.wall_s:.0f} s; results in {run.out}/ (summary.json, trials.csv, pareto.csv, best.yaml)"
    )
    if result.best is None:
        raise _nothing_fits(run, result, summary["nothing_fits"]["smallest_peak_bytes"])
    fitting = [
        r for r in result.results
        if r.outcome is Outcome.OK and r.config["resolution"] == result.best.config["resolution"]
    ]  # fmt: skip
    edge = display.Edge(int(run.gpu.memory_bytes * run.margin), fitting)
    print("\n" + display.best_block(result.best, knob_names, result.fastest, space.best_rule, edge))
    return 0


def _start_line(run: _Checked) -> str:
    """The search's first line: the question it answers, its budget and what backs the margin."""
    meta, space, gpu, trainer = run.meta, run.space, run.gpu, run.meta.get("trainer")
    return (
        f"searching {run.preset.name} on {gpu.name} [{run.backend}]: space {space.name}, "
        f"{len(list(space.combinations()))} combinations x {len(space.resolutions)} resolutions, "
        f"batch {space.min_batch}..{space.max_batch}, budget {size(gpu.budget_bytes(run.margin))} at a "
        f"{run.margin * 100:g}% margin ({meta['margin_basis']}), host budget "
        f"{budget_words(run.host_budget, meta.get('host_budget_basis'))}; study {meta['study']}"
        + (f"; only runs {trainer} can launch" if trainer else "")
        + "".join(
            f"; {k} in {', '.join(map(value, v))}, the values {trainer} runs (it runs none of the space's)"
            for k, v in meta.get("trainer_values", {}).items()
        )
        + "".join(
            f"; {k}={v} as {trainer} runs it" for k, v in meta.get("trainer_stack", {}).items()
        )
    )


def _host_budget_words(run: _Checked) -> str:
    """The host budget, where it came from, and how to give the machine's own RAM."""
    basis = run.meta.get("host_budget_basis")
    words = budget_words(run.host_budget, basis)
    # A typical machine's basis already says how to give yours; so does NOT_STATED.
    if basis is None or "host_memory_gib=" in basis:
        return words
    return f"{words}; set host_memory_gib= to the machine's RAM"


def _fit_the_gpu(runs: int) -> str:
    return "1 run fits the GPU" if runs == 1 else f"{runs} runs fit the GPU"


class NothingFits(AutofitError):
    """No run of the space fits at its target: the search's answer (exit 1)."""


def _nothing_fits(run: _Checked, result: Any, smallest: int) -> NothingFits:
    """Why no run fits: over the host's budget where runs fit the GPU, else the least peak; and
    the way forward the search itself measured, where it has one (a run that fits at another of
    its resolutions)."""
    space, gpu = run.space, run.gpu
    at = resolution_words(space.target_resolution, run.preset.unit)
    forward = _fits_elsewhere(run, result)
    over_host = [r for r in result.results if r.outcome is Outcome.OOM_HOST]
    if over_host:
        least = min(r.host_peak_bytes or 0 for r in over_host)
        return NothingFits(
            f"nothing fits {gpu.name} at {at} with batch >= "
            f"{space.target_min_batch}: {_fit_the_gpu(len(over_host))} but not the host "
            f"(the least host memory found is {size(least)} against a host budget of "
            f"{_host_budget_words(run)}){forward}"
        )
    return NothingFits(
        f"nothing fits {gpu.name} at {at} with batch >= {space.target_min_batch}: "
        f"the smallest peak found is {size(smallest)} against a budget of "
        f"{size(gpu.budget_bytes(run.margin))}{forward}"
    )


def _fits_elsewhere(run: _Checked, result: Any) -> str:
    """Where the search measured a run that fits at another of its resolutions, the largest such
    resolution and its fastest run there, with the setting that answers for it; else nothing."""
    space = run.space
    fitting = [
        r for r in result.results
        if r.outcome is Outcome.OK and r.config["batch_size"] >= space.target_min_batch
    ]  # fmt: skip
    if not fitting:
        return ""
    resolution = max(r.config["resolution"] for r in fitting)
    there = max((r for r in fitting if r.config["resolution"] == resolution),
                key=lambda r: r.samples_per_s or 0)  # fmt: skip
    return (
        f"; at {resolution_words(resolution, run.preset.unit)} it fits: batch "
        f"{there.config['batch_size']}, peak {size(there.peak_bytes)} (add "
        f"target.resolution={resolution} for the best there)"
    )


def left_out_by(space: Any, gpu: Any, trainer: Any = None, preset: Any = None) -> Any:
    """What a search leaves out, and why: with `trainer`, the runs that trainer cannot launch as
    measured; without, values of the space's knobs that only a trainer needs (bf16 under
    autocast holds what pure bf16 holds, at its speed); and on `gpu`, values another does as
    well there (fp16 where the card has bf16)."""
    from autofit.knobs import registry

    searched = {name: registry()[name] for name in space.knobs}

    def left_out(knobs: dict[str, Any]) -> str | None:
        if trainer is not None:
            from autofit.export import unlaunchable

            reason = unlaunchable(trainer, preset, knobs)
            if reason:
                return reason
        for name, knob in searched.items():
            reason = knob.needless_on(knobs[name], space.knobs[name], gpu) or (
                None if trainer is not None
                else knob.needless_without_trainer(knobs[name], space.knobs[name])
            )  # fmt: skip
            if reason:
                return reason
        return None

    return left_out
