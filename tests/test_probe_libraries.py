"""A probe's fresh process leaves out the optional libraries its run does not use
(autofit/probe/libraries.py), and answers exactly as a process holding them all does."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from autofit.families import REGISTRY as FAMILIES
from autofit.gpus import load_gpu
from autofit.knobs import REGISTRY, invalid_reason
from autofit.models import ModelPreset, load_preset
from autofit.probe.build import make_spec
from autofit.probe.launcher import launcher_for
from autofit.probe.libraries import OPTIONAL, libraries_of, used_libraries
from autofit.probe.runner import run_probe
from autofit.probe.worker import execute
from autofit.records.probe import Outcome, ProbeResult, ProbeSpec
from autofit.search.space import load_space
from tests.helpers import custom_preset, spec, with_blocks

PEFT = {"peft", "transformers"}  # peft imports transformers at its own import


@pytest.mark.parametrize(
    ("model", "knobs", "used"),
    [
        ("sana_1600m", {}, set()),
        ("sana_1600m", {"train_mode": "lora"}, PEFT),
        ("sana_1600m", {"train_mode": "qlora"}, PEFT | {"bitsandbytes"}),
        ("sana_1600m", {"optimizer": "adafactor"}, {"transformers"}),
        ("sana_1600m", {"optimizer": "adamw8bit"}, {"bitsandbytes"}),
        ("sana_1600m", {"encoders": "online"}, {"transformers"}),
        ("sana_1600m", {"validation": "on"}, {"transformers"}),
        ("sd3_controlnet", {}, {"transformers"}),  # resident text encoders
        ("sdxl_controlnet", {}, {"transformers"}),
        ("llama3_8b", {"train_mode": "lora"}, PEFT),
        ("flux_dev", {"train_mode": "lora", "optimizer": "adamw8bit"}, PEFT | {"bitsandbytes"}),
    ],
)
def test_a_probe_uses_what_its_family_and_knobs_declare(
    model: str, knobs: dict[str, Any], used: set[str]
) -> None:
    assert used_libraries(spec(model, **knobs)) == used


def test_a_users_own_model_code_may_use_any_library() -> None:
    with custom_preset("custom_models.tiny:build") as preset:
        probe = make_spec(preset, load_gpu("a40"), {}, backend="simulate")
    assert used_libraries(probe) is None


def test_a_searchs_libraries_are_those_of_every_value_of_its_space() -> None:
    """What a search's fork server keeps: the union over the space's knob values (a knob the
    space leaves out at its default), as each run of it would use."""
    assert libraries_of("sana", {"optimizer": ("adamw", "adamw8bit")}) == {"bitsandbytes"}
    assert libraries_of("sana", {"train_mode": ("full", "lora")}) == PEFT
    assert libraries_of("llm", {}) == {"transformers"}
    assert libraries_of("custom", {}) is None
    default = load_space("default", load_preset("sana_1600m"))
    assert libraries_of("sana", default.knobs) == {"bitsandbytes", "transformers"}


@pytest.mark.long
def test_a_fork_server_leaves_out_what_no_run_of_its_search_uses(tmp_path: Path) -> None:
    """Its children answer a run that does not use the library as a fresh worker does, and one
    that does ends as a crash that says the library was left out."""
    plain, lora = spec("tiny_sana", batch_size=2), spec("tiny_sana", train_mode="lora")
    with launcher_for("simulate", "sana", uses=set()) as launcher:
        kept = run_probe(plain, launcher=launcher, log_path=tmp_path / "plain.log")
        crashed = run_probe(lora, launcher=launcher, log_path=tmp_path / "lora.log")
    assert _comparable(kept) == _comparable(execute(plain))
    assert crashed.outcome is Outcome.CRASH
    assert crashed.error is not None and "left peft out" in crashed.error["message"]


def _comparable(result: ProbeResult | dict[str, Any]) -> dict[str, Any]:
    """A result's fields but its wall time and the library versions it lists; JSON's types."""
    figures = dataclasses.asdict(result) if isinstance(result, ProbeResult) else dict(result)
    for varies in ("wall_s", "versions"):
        figures.pop(varies)
    return json.loads(json.dumps(figures))


@pytest.mark.long
def test_a_fresh_worker_leaves_out_what_its_probe_does_not_use_and_answers_the_same(
    tmp_path: Path,
) -> None:
    probe = spec("tiny_sana", batch_size=2)
    log = tmp_path / "worker.log"
    fresh = run_probe(probe, log_path=log)
    assert "left out peft, bitsandbytes, transformers" in log.read_text()
    assert fresh.outcome is Outcome.OK
    # This process holds every library (the tests import them): the same answer, to the byte.
    assert _comparable(fresh) == _comparable(execute(probe))


def test_a_library_left_out_and_imported_anyway_is_a_crash_that_says_so(tmp_path: Path) -> None:
    probe = tmp_path / "spec.json"
    probe.write_text(spec("tiny_sana").to_json())
    code = f"""
import json, pathlib
from autofit.probe.build import make_spec
from autofit.probe.libraries import crash_message, leave_out_unused
from autofit.records.probe import ProbeSpec
left = leave_out_unused([ProbeSpec.from_json(pathlib.Path({str(probe)!r}).read_text())])
try:
    import peft
except ImportError as exc:
    print(json.dumps([left, crash_message(exc)]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    left, message = json.loads(done.stdout)
    assert left == list(OPTIONAL)
    assert "left peft out" in message and "declare it" in message


# -- every knob value, in a process that left out what it does not declare ----------------------

SWEEP = r"""
import dataclasses, json, sys
from autofit.probe.libraries import leave_out_unused
from autofit.records.probe import ProbeSpec
from autofit.probe.worker import execute
specs = [ProbeSpec.from_json(text) for text in json.load(sys.stdin)]
left = leave_out_unused(specs)
answers = [dataclasses.asdict(execute(one)) for one in specs]
print(json.dumps({"left": left, "answers": answers}))
"""


def _knob_probes() -> list[ProbeSpec]:
    """One probe of every shipped model family at its defaults (two blocks of each block list),
    and one per value of every knob with a closed set of values, on a small image model with
    companions and a one-block language model: each alone, or with a LoRA run where it is a LoRA
    run's setting."""
    families = ("sd35_medium", "sd3_controlnet", "flux_dev", "sdxl", "sdxl_controlnet", "tiny_mlp")
    probes = [with_blocks(spec(model, batch_size=1), 2) for model in families]
    for model in (spec("tiny_sana", batch_size=1), with_blocks(spec("llama3_2_1b"), 1)):
        preset = ModelPreset.from_dict(model.model)
        for knob in REGISTRY.values():
            for value in knob.choices or ():
                for extra in ({}, {"train_mode": "lora"}):
                    knobs = {**model.knobs, **extra, knob.name: value}
                    if not invalid_reason(knobs, model.gpu_spec, preset, "simulate"):
                        probes.append(dataclasses.replace(model, knobs=knobs))
                        break
    return probes


@pytest.mark.slow
def test_every_knob_value_runs_where_what_it_does_not_declare_is_left_out() -> None:
    """Probes grouped by the libraries they declare, each group in a fresh process that left
    out the rest: none imports a library it left out (which would crash, saying so), and each
    answers as it does in this process, which holds every library."""
    groups: dict[frozenset[str], list[ProbeSpec]] = {}
    for probe in _knob_probes():
        used = used_libraries(probe)
        assert used is not None
        groups.setdefault(frozenset(used), []).append(probe)
    assert frozenset() in groups and len(groups) >= 3
    for used, probes in groups.items():
        done = subprocess.run(
            [sys.executable, "-c", SWEEP],
            input=json.dumps([probe.to_json() for probe in probes]),
            capture_output=True, text=True, timeout=1200,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        said = json.loads(done.stdout.splitlines()[-1])
        assert set(said["left"]) == set(OPTIONAL) - used
        for probe, answer in zip(probes, said["answers"], strict=True):
            assert answer["outcome"] != Outcome.CRASH.value, (probe.knobs, answer["error"])
            assert _comparable(answer) == _comparable(execute(probe)), probe.knobs


IMPORT_LEAVING_OUT = r"""
import importlib, json, sys
left, modules = json.loads(sys.argv[1])
for name in left:
    sys.modules[name] = None
for module in modules:
    importlib.import_module(module)
"""


@pytest.mark.long
def test_every_familys_workload_imports_where_what_its_defaults_do_not_use_is_left_out() -> None:
    """A run at a family's defaults (cached encoders: no text encoder runs) leaves out every
    optional library its family does not declare: its workload module must import without them,
    as a fresh probe's process and a search's fork server import it. Families grouped by what
    they keep, one fresh process per group."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for name, family in FAMILIES.items():
        kept = libraries_of(name, {})
        if kept is not None:
            groups.setdefault(tuple(sorted(kept)), []).append(family.workload)
    assert len(sum(groups.values(), [])) >= 14  # every shipped family but the user's own
    for kept, modules in groups.items():
        left = [name for name in OPTIONAL if name not in kept]
        done = subprocess.run(
            [sys.executable, "-c", IMPORT_LEAVING_OUT, json.dumps([left, modules])],
            capture_output=True, text=True,
        )  # fmt: skip
        assert done.returncode == 0, f"left out {left}: {done.stderr[-2000:]}"
