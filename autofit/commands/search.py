"""`autofit search`: the largest and fastest run that fits, every probe in an Optuna study."""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig

from autofit.backends import resolve
from autofit.calibration.margins import chosen_margin, classes_spanned
from autofit.command_line import key_of
from autofit.config import as_given, compose_config
from autofit.errors import AutofitError, ConfigError, Interrupted, NothingToSearch
from autofit.export import target, trainer_stack, trainer_values, unlaunchable
from autofit.host import HOST_MEMORY_GIB, budget_words
from autofit.host import host_budget as host_budget_of
from autofit.knobs import registry
from autofit.knobs.frames import clip_refusal
from autofit.paths import ensure_writable
from autofit.probe.build import (
    BACKEND,
    MARGIN,
    TIMEOUT_S,
    check_custom,
    gpu_from_config,
    preset_from_config,
)  # fmt: skip
from autofit.probe.launcher import launcher_for
from autofit.probe.libraries import libraries_of
from autofit.records.probe import Outcome
from autofit.report.tables import pareto_table
from autofit.results import check_study_name, load_study, rerun_command, study_folder, write_results
from autofit.search import display
from autofit.search.engine import Search
from autofit.search.prober import Prober
from autofit.search.progress import Progress
from autofit.search.recorder import StudyRecorder, default_storage
from autofit.search.retry import PATIENCE_S, StorageError, StorageUnavailable
from autofit.search.space import SearchSpace, load_space
from autofit.search.storage import check_url, storage_file
from autofit.settings import FLAG, SHARE, TEXT, built, entry, group, integer, number, setting
from autofit.units import many, resolution_words, size, value

# Simulated probes are single-threaded Python: one per core keeps both busy.
MAX_DEFAULT_JOBS = 4


@dataclasses.dataclass(frozen=True)
class TargetSettings:
    """`target.`: where the best run is chosen (conf/search.yaml says what each means)."""

    resolution: int | None = setting(None, integer(1).or_null())
    frames: int | None = setting(None, integer(1).or_null())
    min_batch: int | None = setting(None, integer(1).or_null())
    speed_tolerance: float | None = setting(None, SHARE.or_null())
    memory_gain: float | None = setting(None, SHARE.or_null())


@dataclasses.dataclass(frozen=True, kw_only=True)
class SearchSettings:
    """`autofit search`'s settings, each with its rule; conf/search.yaml gives the defaults and
    says what each means. `model` and `gpu` are the composed entries, checked as they are read."""

    model: dict[str, Any] = entry()
    gpu: dict[str, Any] = entry()
    space: str = setting("default", TEXT)
    backend: str = setting("auto", BACKEND)
    margin: float | str = setting("auto", MARGIN)
    host_memory_gib: float | None = setting(None, HOST_MEMORY_GIB)
    timeout_s: float = setting(900.0, TIMEOUT_S)
    jobs: int | None = setting(None, integer(1).or_null())
    storage: str | None = setting(None, TEXT.or_null())
    retry_failed: bool = setting(True, FLAG)
    claim_grace_s: float = setting(60.0, number(lambda v: v > 0, "expected seconds > 0"))
    storage_patience_s: float = setting(
        PATIENCE_S, number(lambda v: v >= 0, "expected seconds >= 0")
    )
    trainer: str | None = setting(None, TEXT.or_null())
    study: str | None = setting(None, TEXT.or_null())
    out: str | None = setting(None, TEXT.or_null())
    target: TargetSettings = group(TargetSettings)


def search_settings(cfg: Any) -> SearchSettings:
    """The settings of a composed `search` config, every one checked."""
    return built(SearchSettings, cfg)


def run(overrides: list[str]) -> int:
    return run_config(compose_config("search", overrides), overrides)


def run_config(cfg: Any, given: list[str] | None = None) -> int:
    """Run the search a composed `search` config describes; print it; write its files. `given`:
    the overrides as the user typed them (a sweep's job: Hydra's record of its own), which the
    `rerun` line repeats."""
    return search(search_settings(cfg), _job_overrides() if given is None else given)


def search(
    settings: SearchSettings, given: list[str] | None, tried: frozenset[str] = frozenset()
) -> int:
    """The search `settings` describe: every part made and checked, then the probes, then what
    it prints. Where nothing fits and its space names another to search (`if_nothing_fits`),
    that search next, once per space (`tried`)."""
    run = _checked(settings, given)
    try:
        return _render(run, _probed(run))
    except StorageError as exc:
        raise type(exc)(f"{exc}; {_resume_words(exc, run.meta, run.out)}") from None
    except (NothingFits, NothingToSearch) as exc:
        return _go_on(exc, run.space, settings, given, tried)


def study_and_folder(
    settings: SearchSettings, preset: Any, gpu: Any, space: Any
) -> tuple[str, Path]:
    """The study a search's settings name (`study=`, else `<model>-<gpu>-<space>[-<trainer>]`)
    and the folder its files go to (`out=`, else results/<study>/)."""
    trainer = settings.trainer
    default_name = f"{preset.label}-{gpu.label}-{space.name}" + (f"-{trainer}" if trainer else "")
    # A name, not a path (results.check_study_name): out= chooses a folder.
    named = settings.study
    study_name = check_study_name(named) if named is not None else default_name
    return study_name, Path(settings.out) if settings.out else study_folder(study_name)


def _inside(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def _default_jobs(backend: str) -> int:
    return 1 if backend == "cuda" else max(1, min(MAX_DEFAULT_JOBS, os.cpu_count() or 1))


def next_search(settings: SearchSettings, space: str) -> SearchSettings:
    """The settings of the search `if_nothing_fits` starts: the same but the space, and a study
    and folder of its own where the user named them (study=NAME-<space>, out=FOLDER-<space>);
    unnamed, they follow from the space as any search's do."""
    stem = Path(space).stem
    return dataclasses.replace(
        settings,
        space=space,
        study=f"{settings.study}-{stem}" if settings.study is not None else None,
        out=f"{settings.out}-{stem}" if settings.out else None,
    )


def _checked(settings: SearchSettings, given: list[str] | None) -> _Checked:
    """Every part of the search made from its settings and checked, before any probe runs: the
    model, the card, the space (for the trainer, at the target), the margin and the backend, then
    the study's folder and storage."""
    preset, gpu = preset_from_config(settings.model), gpu_from_config(settings.gpu)
    space = load_space(settings.space, preset)
    trainer, stack, in_place, space = _for_trainer(settings.trainer, preset, space, gpu)
    margin = chosen_margin(
        settings.margin, preset.family, classes_spanned(preset.family, space.knobs)
    )
    budget = gpu.budget_bytes(margin.value)
    space = _with_target(settings.target, preset, space)
    left_out = left_out_by(space, gpu, trainer, preset)
    # Before any folder or study is made: a backend that cannot run here, a model that fails.
    backend = resolve(settings.backend, gpu, budget)
    check_custom(preset, settings.timeout_s)

    study_name, out = study_and_folder(settings, preset, gpu, space)
    storage = _prepared_storage(settings.storage, out)
    host_budget, basis = host_budget_of(settings.host_memory_gib, backend, gpu)
    meta = {"study": study_name, "model": preset.name, "gpu": gpu.name, "backend": backend, "space": space.name,
            "margin": margin.value, "margin_basis": margin.basis, "host_budget_bytes": host_budget,
            "storage": storage}  # fmt: skip
    if basis is not None:  # written where there is a budget to explain (schema.py)
        meta["host_budget_basis"] = basis
    if settings.trainer:
        meta["trainer"] = settings.trainer
        meta["trainer_stack"] = stack
        if in_place:
            meta["trainer_values"] = {k: list(v) for k, v in in_place.items()}
    # Every setting as the user gave it, but where the folder and the study are: the `rerun`
    # line and the probe lines printed for the user repeat them (autofit/results/write.py).
    if given is not None:
        meta["overrides"] = [o for o in given if key_of(o) not in ("out", "study", "storage")]
    return _Checked(
        meta, space, preset, gpu, backend, margin.value, settings.timeout_s, host_budget,
        left_out, out, settings.jobs or _default_jobs(backend), settings.retry_failed,
        settings.claim_grace_s, settings.storage_patience_s,
    )  # fmt: skip


def _go_on(
    exc: AutofitError, space: SearchSpace, settings: SearchSettings, given: list[str] | None,
    tried: frozenset[str],
) -> int:  # fmt: skip
    """Where `space` has no run (`exc` says why: nothing fits, or nothing here is a run this
    card or trainer can launch), the search of the space it names next; else `exc`."""
    following = space.if_nothing_fits
    if following is None or Path(following).stem in tried:
        raise exc
    print(
        f"\n{exc}\n\nsearching space {following} next, where space {space.name} has no run "
        "(its if_nothing_fits)\n",
        flush=True,
    )
    if given is not None:
        given = [o for o in given if key_of(o) not in ("space", "study", "out")]
        given.append(f"space={following}")
    try:
        return search(next_search(settings, following), given, tried | {space.name})
    except NothingToSearch as none:
        raise NothingFits(f"{exc}; space {following}, searched next, has no run: {none}") from None


def _for_trainer(
    trainer: Any, preset: Any, space: SearchSpace, gpu: Any = None
) -> tuple[Any, dict[str, Any], dict[str, tuple[Any, ...]], SearchSpace]:
    """The target `trainer=` names (None without one), the values it runs of the knobs it
    decides itself (`trainer_stack`), the values it runs of knobs where it runs none the space
    gives (`trainer_values`), and the space with both in place for every trial."""
    if trainer is None:
        return None, {}, {}, space
    chosen = target(trainer, setting="trainer")
    chosen.check_family(preset, setting="trainer")
    values = trainer_values(chosen, preset, space.knobs, gpu)
    searched = {**space.knobs, **values}
    stack = trainer_stack(chosen, preset, searched)
    fixed = {**searched, **{k: (v,) for k, v in stack.items()}}
    return chosen, stack, values, dataclasses.replace(space, knobs=fixed)


def _with_target(target: TargetSettings, preset: Any, space: SearchSpace) -> SearchSpace:
    """The space with the `target.` settings in place (the resolution the best is chosen at, a
    video model's clip length, the least batch it may have, the best rule's tolerances), checked
    against the model and space."""
    if target.resolution is not None:
        preset.check_resolution(target.resolution)
        if target.resolution not in space.resolutions:
            raise ConfigError(
                f"target.resolution={target.resolution} is not searched by space {space.name}; "
                f"its resolutions: {', '.join(map(str, space.resolutions))}"
            )
        space = dataclasses.replace(space, target_resolution=target.resolution)
    if target.frames is not None:
        reason = clip_refusal(target.frames, preset)
        if reason is not None:
            raise ConfigError(f"target.{reason}")
        space = dataclasses.replace(space, knobs={**space.knobs, "frames": (target.frames,)})
    if target.min_batch is not None:
        space = dataclasses.replace(space, target_min_batch=target.min_batch)
    rule = space.best_rule.replaced(dataclasses.asdict(target), "target.")
    space = dataclasses.replace(space, best_rule=rule)
    if space.target_min_batch > space.max_batch:  # no run could be the best: say so, probe nothing
        raise ConfigError(
            f"target.min_batch={space.target_min_batch} is above space {space.name}'s largest "
            f"batch, {space.max_batch}; valid: 1 to {space.max_batch}"
        )
    return space


def _prepared_storage(given: str | None, out: Path) -> str:
    """The study storage's URL (`storage=`, else results/studies.db), checked and writable,
    before anything is probed: the results folder `out` and a SQLite file's folder."""
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
    if not HydraConfig.initialized():
        return None
    return as_given(list(HydraConfig.get().overrides.task))


def _resume_words(exc: StorageError, meta: dict[str, Any], out: Path) -> str:
    """What the user does after the storage failed, and the command that resumes the search."""
    command = rerun_command(meta, out)
    if isinstance(exc, StorageUnavailable):
        return f"every probe that finished before is kept there; rerun `{command}` once it is back"
    return f"rerun `{command}` once that is mended, or with another storage="


def _probed(run: _Checked) -> Any:
    """The search itself, once every setting is checked: every probe, each stored in the study
    as it finishes, with its progress on stderr; the engine's result."""
    space, preset, meta = run.space, run.preset, run.meta
    recorder = StudyRecorder(
        meta["storage"], meta["study"], {k: v for k, v in meta.items() if k != "storage"},
        retry_failed=run.retry_failed, claim_grace_s=run.grace_s, patience_s=run.patience_s,
    )  # fmt: skip
    progress = Progress(sys.stderr, space, list(space.knobs), unit=preset.unit)
    print(_start_line(run), flush=True)
    try:
        uses = libraries_of(preset.family, space.knobs)  # the fork server leaves out the rest
        with launcher_for(run.backend, preset.family, uses) as launcher:
            prober = Prober(
                preset, run.gpu, run.backend, run.margin, run.timeout_s, recorder, launcher,
                run.host_budget,
            )  # fmt: skip
            try:
                return Search(
                    space, prober, jobs=run.jobs, listener=progress, left_out=run.left_out
                ).run()  # fmt: skip
            finally:
                prober.close()
    except Interrupted as exc:  # the launcher's exit has ended every probe; say what is kept
        recorder.close()  # the writes in flight end first: the count is what the study holds
        exc.note = _kept_words(recorder, meta["study"])
        raise
    finally:
        recorder.close()  # gives back the claims of probes that did not finish
        progress.close()


def _kept_words(recorder: StudyRecorder, study_name: str) -> str:
    """What an interrupted search keeps, and how to resume it."""
    unsettled = (
        f" ({many(recorder.unsettled, 'write')} of more still under way as it stopped)"
        if recorder.unsettled
        else ""
    )
    return (
        f"{many(recorder.recorded, 'probe')} finished here, stored in study {study_name}"
        f"{unsettled}; rerun the same command to resume"
    )


def _render(run: _Checked, result: Any) -> int:
    """The search's files, and what it prints: the Pareto table, what lost, the count and the
    best run (or why nothing fits)."""
    space, knob_names = run.space, list(run.space.knobs)
    counts = {"budget_bytes": result.budget_bytes, "n_probes": result.new_probes + result.reused_probes,
              "new_probes": result.new_probes, "reused_probes": result.reused_probes,
              "wall_s": round(result.wall_s, 2)}  # fmt: skip
    front = [r for runs in result.pareto.values() for r in runs]
    summary = write_results(
        run.out, run.meta, result.results, result.combinations, front, result.best, counts,
        knob_names, result.fastest, space.best_rule, run.preset,
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
    searched = {name: registry()[name] for name in space.knobs}

    def left_out(knobs: dict[str, Any]) -> str | None:
        if trainer is not None:
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
