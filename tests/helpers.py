"""Shared helpers: specs for shipped presets without going through the CLI, and the CLI as a
user runs it: in a fresh interpreter, or in this process (`cli.main`, for the many mistakes that
are caught before anything runs)."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import itertools
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from autofit.backends import cpu, simulate
from autofit.fastpath.batch_curve import canonical_frees
from autofit.gpus import load_gpu
from autofit.knobs import defaults, invalid_reason
from autofit.models import load_preset
from autofit.paths import group_options
from autofit.probe.build import make_spec
from autofit.records.probe import ProbeSpec


def spec(model: str, gpu: str = "a40", backend: str = "simulate", **knobs: Any) -> ProbeSpec:
    return make_spec(load_preset(model), load_gpu(gpu), knobs, backend=backend, timeout_s=300)


# Llama 3's layers and untied output head at a width a CPU steps in a second.
TINY_LLAMA = {
    "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
}  # fmt: skip


def presets_by_family() -> dict[str, Any]:
    """The first shipped preset of each model family, by family."""
    presets: dict[str, Any] = {}
    for name in group_options("model"):
        preset = load_preset(name)
        presets.setdefault(preset.family, preset)
    return presets


def changes_around(knob: str, alternatives: Callable[[str], list[Any]]) -> Iterator[dict[str, Any]]:
    """What to change besides `knob` to find a configuration that runs it, fewest changes first:
    nothing, then each other technique knob at one of its `alternatives` other than its default,
    then two such changes at once."""
    from autofit.knobs import REGISTRY, WORKLOAD_KNOBS

    others = [k for k in REGISTRY if k != knob and k not in WORKLOAD_KNOBS]
    singles = [{k: v} for k in others for v in alternatives(k) if v != REGISTRY[k].default]
    yield {}
    yield from singles
    for a, b in itertools.combinations(singles, 2):
        if set(a).isdisjoint(b):
            yield {**a, **b}


def refusal(knobs: dict[str, Any], model: str, gpu: str = "a40") -> str | None:
    """Why `knobs` (over every other knob's default) cannot run `model` on `gpu`, or None."""
    return invalid_reason({**defaults(), **knobs}, load_gpu(gpu), load_preset(model), "simulate")


def assert_refused(knobs: dict[str, Any], model: str, reason: str) -> None:
    """A rule refuses `knobs` for `model`, its one line beginning with `reason`."""
    got = refusal(knobs, model)
    assert got is not None and got.startswith(reason), got


def tiny_llama(backend: str = "simulate", **knobs: Any) -> ProbeSpec:
    """llama3_8b's probe (batch 2 of 32 tokens unless `knobs` say otherwise) on TINY_LLAMA."""
    import copy

    probe = spec("llama3_8b", backend=backend, **{"batch_size": 2, "resolution": 32, **knobs})
    arch = copy.deepcopy(probe.model["architecture"])
    arch["config"].update(TINY_LLAMA)
    return dataclasses.replace(probe, model={**probe.model, "architecture": arch})


# Wan's block (self- and cross-attention with query-key norms, the gated feed-forward, the
# timestep modulation) at a width a CPU steps in a second; umT5, the Wan VAEs and Wan 2.1 I2V's
# CLIP vision tower (28 px in 14 px patches: 5 tokens) likewise.
TINY_WAN = {
    "num_attention_heads": 2, "attention_head_dim": 16, "ffn_dim": 64, "num_layers": 2,
    "text_dim": 32, "freq_dim": 32,
}  # fmt: skip
TINY_UMT5 = {
    "vocab_size": 500, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 4,
}  # fmt: skip
TINY_VAE = {"base_dim": 8, "decoder_base_dim": 8}
TINY_WAN_COMPANIONS = {
    "text_encoder": TINY_UMT5,
    "vae": TINY_VAE,
    "image_encoder": {
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
    },
}  # fmt: skip


def tiny_wan(
    backend: str = "simulate", image: bool = False, model: str = "wan2_1_t2v_1_3b", **knobs: Any
) -> ProbeSpec:
    """`model`'s probe (batch 2 of 5-frame 64 px clips unless `knobs` say otherwise) on a Wan of
    TINY_WAN's widths, its prompt 16 tokens of TINY_UMT5 (the 512 a CLIP-conditioned Wan splits
    its context by, for one), its companions TINY_WAN_COMPANIONS' sizes; `image`: the
    1.3B with Wan 2.2 I2V's first-frame channels."""
    import copy

    probe = spec(
        model, backend=backend, **{"batch_size": 2, "resolution": 64, "frames": 5, **knobs}
    )
    found = copy.deepcopy(probe.model)
    arch, inputs = found["architecture"], found["inputs"]
    arch.update(TINY_WAN)
    inputs.update(text_dim=TINY_WAN["text_dim"])
    if not inputs.get("image_tokens"):
        inputs["text_tokens"] = 16
    for role, companion in found["companions"].items():
        companion["architecture"].update(TINY_WAN_COMPANIONS[role])
    if inputs.get("image_tokens"):  # the CLIP embedding's tokens and width at the tiny sizes
        clip = TINY_WAN_COMPANIONS["image_encoder"]
        inputs.update(image_tokens=(clip["image_size"] // clip["patch_size"]) ** 2 + 1)
        inputs.update(image_dim=clip["hidden_size"])
        width = TINY_WAN["num_attention_heads"] * TINY_WAN["attention_head_dim"]
        arch.update(image_dim=clip["hidden_size"], added_kv_proj_dim=width)
    if image:  # image-to-video: the first frame's mask and latents beside the noisy latents
        inputs["condition_channels"] = 20
        arch["in_channels"] = 36
    return dataclasses.replace(probe, model=found)


def with_blocks(probe: ProbeSpec, blocks: int) -> ProbeSpec:
    """The same probe on a model with the preset's widths, layer types, inputs and companions but
    only `blocks` of its transformer blocks (per block list): its tensors are as large as the real
    model's, its step a fraction of the cost."""
    import copy

    arch = copy.deepcopy(probe.model["architecture"])
    family = probe.model["family"]
    if family == "llm":
        arch["config"]["num_hidden_layers"] = blocks
    elif family in ("sdxl", "sdxl_controlnet"):  # transformer blocks per UNet level
        arch["transformer_layers_per_block"] = [
            min(n, blocks) for n in arch["transformer_layers_per_block"]
        ]
    elif family == "sd3_controlnet":
        for part in ("transformer", "controlnet"):
            arch[part]["num_layers"] = blocks
    elif "num_layers" in arch:  # sana, sd3, flux (a tiny model has nothing to trim)
        arch["num_layers"] = blocks
        if "num_single_layers" in arch:
            arch["num_single_layers"] = blocks
        if "dual_attention_layers" in arch:  # SD3.5 Medium's first blocks
            arch["dual_attention_layers"] = list(range(blocks))
    return dataclasses.replace(probe, model={**probe.model, "architecture": arch})


def autofit(
    *args: str, cwd: Path, pythonpath: Path | None = None, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    """`autofit <args>` in a fresh interpreter, run in `cwd`; `pythonpath` makes a user's own
    modules importable, as `model.entry` needs."""
    env = {**os.environ, "PYTHONPATH": str(pythonpath)} if pythonpath else None
    return subprocess.run(
        [sys.executable, "-m", "autofit", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


def in_process(
    *args: str, cwd: Path, pythonpath: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`autofit <args>` through `cli.main` in this process, run in `cwd`, with what it printed: as
    `autofit()` gives it, without a new interpreter's start-up. An exception escaping `main` (a
    traceback, for a user) fails the test."""
    from autofit.cli import main

    out, err = io.StringIO(), io.StringIO()
    here, path, env = Path.cwd(), list(sys.path), os.environ.get("PYTHONPATH")
    os.chdir(cwd)
    if pythonpath:  # the user's modules, importable here and in the probes' workers
        sys.path.insert(0, str(pythonpath))
        os.environ["PYTHONPATH"] = str(pythonpath)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(list(args))
    finally:
        os.chdir(here)
        sys.path[:] = path
        if pythonpath:
            if env is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = env
    return subprocess.CompletedProcess(["autofit", *args], code, out.getvalue(), err.getvalue())


@contextlib.contextmanager
def custom_preset(entry: str) -> Any:
    """The `custom` preset building `entry` (a model of tests/custom_models), importable while
    the block runs (a probe imports it when the run is built)."""
    from autofit.models import ModelPreset

    tests = str(Path(__file__).parent)
    sys.path.insert(0, tests)
    try:
        yield ModelPreset.from_dict({**load_preset("custom").to_dict(), "entry": entry})
    finally:
        sys.path.remove(tests)


@contextlib.contextmanager
def read_only(folder: Path) -> Any:
    """`folder` (made if missing), its contents as they are, where nothing can be written: its
    folders without write permission, or for root, whom permissions do not stop, the folder
    bind-mounted read-only over itself. Where root may not mount, an empty folder becomes a file
    (writing under it fails as well, with ENOTDIR); a folder with contents skips the test."""
    import pytest

    folder.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0:
        folders = [folder, *(p for p in folder.rglob("*") if p.is_dir())]
        for each in folders:
            each.chmod(0o555)
        try:
            yield
        finally:
            for each in folders:
                each.chmod(0o755)
        return
    bound = subprocess.run(["mount", "--bind", str(folder), str(folder)], capture_output=True)
    if bound.returncode == 0:
        try:
            subprocess.run(
                ["mount", "-o", "remount,ro,bind", str(folder)], capture_output=True, check=True
            )
            yield
        finally:
            subprocess.run(["umount", str(folder)], check=True)
        return
    if any(folder.iterdir()):
        pytest.skip(f"root here may not mount ({bound.stderr.decode().strip()})")
    folder.rmdir()
    folder.write_text("")
    try:
        yield
    finally:
        folder.unlink()
        folder.mkdir()


def study_trials(storage: str, study: str) -> list[Any]:
    """A study's trials, read without keeping a connection open (a disk a test unmounts)."""
    import optuna

    backend = optuna.storages.RDBStorage(storage)
    try:
        return optuna.load_study(study_name=study, storage=backend).get_trials(deepcopy=False)
    finally:
        backend.engine.dispose()


def probe_counts(storage: str, study: str) -> Counter[str]:
    """How many times each probe was recorded: the trials that are a probe's answer (a claim
    released, lost or still running is none)."""
    from optuna.trial import TrialState

    return Counter(
        t.user_attrs["key"]
        for t in study_trials(storage, study)
        if t.user_attrs.get("kind") == "probe" and t.state in (TrialState.COMPLETE, TrialState.FAIL)
    )


def assert_same_allocations(fake: Any, real: Any) -> None:
    """The two logs hold the same allocations, in the same order, of the same categories, to
    the same peak."""
    assert fake.sizes == real.sizes
    assert canonical_frees(fake.events) == canonical_frees(real.events)  # frees run in hash order
    assert fake.categories == real.categories
    assert fake.peak_report() == real.peak_report()


def assert_fake_equals_real(probe: ProbeSpec) -> None:
    """The probe's step traced on fake tensors (the simulate backend) holds the allocations the
    same step holds on real ones (the cpu backend)."""
    _, fake = simulate.trace(probe)
    _, real = cpu.trace(dataclasses.replace(probe, backend="cpu"))
    assert_same_allocations(fake, real)


def trainer_search(trainer: str, model: str, gpu: str) -> tuple[Any, Any, Any, list[Any]]:
    """What `autofit search model=MODEL gpu=GPU space=quick trainer=TRAINER` searches, without a
    probe: the target, the values it decides itself and those put in place for it, and each
    combination the card can run with why the trainer cannot launch it (None where it can)."""
    from autofit.commands.search import _for_trainer
    from autofit.export import unlaunchable
    from autofit.search.space import load_space

    preset, card = load_preset(model), load_gpu(gpu)
    chosen, stack, values, space = _for_trainer(trainer, preset, load_space("quick", preset), card)
    runs = []
    for combination in space.combinations():
        knobs = {**defaults(), **combination, "resolution": space.resolutions[0]}
        if invalid_reason(knobs, card, preset, "simulate") is None:
            runs.append((knobs, unlaunchable(chosen, preset, knobs)))
    return chosen, stack, values, runs
