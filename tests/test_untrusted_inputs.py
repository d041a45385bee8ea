"""Files and values a user hands autofit are bounded and checked before use: a YAML bomb (aliases
expanding to billions of values) is refused in one line, at once and in little memory, wherever
autofit reads YAML; a preset that is broken, nonsense or overridden into a size below 1 is
refused in one line before any probe; a huge value is cut in the error that quotes it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from helpers import in_process

import autofit.paths
from autofit.errors import ConfigError
from autofit.paths import calibration_dir, conf_dir, search_spaces_dir
from autofit.yaml_files import MAX_VALUES, read_yaml

# `autofit <args>` with conf/ read from the folder argv[1] names (a copy of autofit's), and the
# process's peak memory written to the file argv[2] names. /proc's VmHWM counts this program's
# own pages: getrusage's ru_maxrss would count those of the parent it forked from (pytest) too.
CLI = """
import pathlib, sys
import autofit.paths
root, peak = sys.argv[1:3]
autofit.paths._PACKAGE = pathlib.Path(root) / "autofit"
from autofit.cli import main
try:
    code = main(sys.argv[3:])
finally:
    status = pathlib.Path("/proc/self/status").read_text().splitlines()
    pathlib.Path(peak).write_text(next(s for s in status if s.startswith("VmHWM:")).split()[1])
sys.exit(code)
"""
SECONDS = 30  # an expanded bomb runs for minutes (or, refused late, 11 s and 1.2 GB)
PEAK_MIB = 100  # a refused configuration peaks at about 30 MiB; an expanded bomb at gigabytes
TINY_MLP = (conf_dir() / "model" / "tiny_mlp.yaml").read_text()
CARD = (conf_dir() / "gpu" / "l4.yaml").read_text().replace("name: l4", "name: mycard")
EXPANDS = (
    f"expands past {MAX_VALUES} values once its aliases (*name) are repeated in full; autofit "
    "reads no YAML file that large"
)


def bomb(levels: int = 9, width: int = 9) -> str:
    """The billion laughs as one YAML flow value: `levels` nested lists, each of its first
    element's anchor and `width - 1` aliases to it: width**levels values, in 400 characters."""
    node = f"&a0 [{', '.join(['lol'] * width)}]"
    for level in range(1, levels):
        node = f"&a{level} [{node}{f', *a{level - 1}' * (width - 1)}]"
    return node


def bounded(*args: str, cwd: Path, root: Path) -> tuple[int, str, float]:
    """`autofit <args>` in a fresh interpreter, with conf/ from `root`: its exit code, its stderr
    and its peak memory in MiB. Killed, and the test failed, after SECONDS."""
    peak = cwd / "peak_kib"
    done = subprocess.run(
        [sys.executable, "-c", CLI, str(root), str(peak), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SECONDS,
    )
    return done.returncode, done.stderr, int(peak.read_text()) / 1024


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A copy of autofit's folders, as `_PACKAGE.parent` finds them: conf/ copied (a test adds
    files to it), search_spaces/ and calibration/ linked."""
    folder = tmp_path / "root"
    shutil.copytree(conf_dir(), folder / "conf")
    (folder / "search_spaces").symlink_to(search_spaces_dir())
    (folder / "calibration").symlink_to(calibration_dir())
    return folder


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    """A mistake caught before anything ran: exit code 2, one line on stderr, no traceback."""
    assert done.returncode == 2, done.stderr
    assert done.stdout == "" and "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def preset(**changes: object) -> str:
    """tiny_mlp's preset with `changes` (None: the field left out), as YAML."""
    fields = {**yaml.safe_load(TINY_MLP), "name": "broken", **changes}
    return yaml.safe_dump({k: v for k, v in fields.items() if v is not None})


@pytest.mark.parametrize(
    "file,named,text,args",
    [
        (
            "bomb.yaml",
            "bomb.yaml",
            f"batch_size: {{min: 1, max: 4}}\nresolution: [{bomb()}]\n",
            ["search", "model=tiny_mlp", "gpu=l4", "space=bomb.yaml"],
        ),
        (
            "bomb.yaml",
            "bomb.yaml",
            f"batch_size: {{min: 1, max: 4}}\nknobs:\n  precision: {bomb()}\n",
            ["search", "model=tiny_mlp", "gpu=l4", "space=bomb.yaml"],
        ),
        (
            "card.yaml",
            "gpu=card.yaml",
            CARD.replace('notes: "PCIe 4.0 x16"', f"notes: {bomb()}"),
            ["search", "model=tiny_mlp", "gpu=card.yaml"],
        ),
        (
            "bomb.yaml",
            "bomb.yaml",
            f"cases:\n  - model: {bomb()}\n",
            ["calibrate", "set=bomb.yaml", "measure=cpu", "dry_run=true"],
        ),
        (
            "conf/model/bomb.yaml",
            "conf/model/bomb.yaml",
            TINY_MLP.replace("name: tiny_mlp", "name: bomb").replace(
                "  out_features: 64\n", f"  out_features: 64\n  extra: {bomb()}\n"
            ),
            ["search", "model=bomb", "gpu=l4"],
        ),
    ],
    ids=["space resolution", "space knob values", "gpu card", "calibration set", "preset"],
)
def test_a_yaml_bomb_is_refused_in_one_line_at_once_and_in_little_memory(
    tmp_path: Path, root: Path, file: str, named: str, text: str, args: list[str]
) -> None:
    folder = root if file.startswith("conf/") else tmp_path
    (folder / file).write_text(text)
    started = time.monotonic()
    code, said, peak_mib = bounded(*args, cwd=tmp_path, root=root)
    seconds = time.monotonic() - started
    assert (code, said.strip()) == (2, f"autofit: error: {named}: {EXPANDS}"), said[:500]
    assert peak_mib < PEAK_MIB
    assert seconds < 10  # the interpreter's start and Hydra's import included
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "text,says,seconds",
    [
        (f"a: {bomb()}\n", "expands past", 0.5),
        # A merge key (<<) copies the merged mapping's pairs: nine of nine, nine levels deep.
        (
            "a0: &a0 {k: v}\n"
            + "".join(
                f"a{n}: &a{n} {{<<: [{', '.join([f'*a{n - 1}'] * 9)}]}}\n" for n in range(1, 10)
            ),
            "expands past",
            0.5,
        ),
        ("a: &a [*a]\n", "expands past", 0.5),  # an alias inside its own anchor: no end
        (f"a: {'[' * 40}{']' * 40}\n", "nests deeper than 32 levels", 0.5),
        # Past PyYAML's own recursion; its scanner, pure Python, takes its time to get there.
        (f"a: {'[' * 5000}{']' * 5000}\n", "nests deeper than 32 levels", 5),
    ],
    ids=["billion laughs", "merge keys", "self alias", "40 deep", "5000 deep"],
)
def test_the_loader_refuses_a_bomb_before_building_it(
    tmp_path: Path, text: str, says: str, seconds: float
) -> None:
    (tmp_path / "x.yaml").write_text(text)
    started = time.monotonic()
    with pytest.raises(ConfigError) as refused:
        read_yaml(tmp_path / "x.yaml", "x.yaml")
    assert time.monotonic() - started < seconds
    said = str(refused.value)
    assert said.startswith(f"x.yaml: {says}") and len(said.splitlines()) == 1, said


def test_aliases_within_the_limit_read_as_yaml_reads_them(tmp_path: Path) -> None:
    text = "base: &base {precision: bf16, optimizer: [adamw, sgd]}\nrun: {<<: *base, ema: on}\n"
    text += f"wide: {bomb(levels=3, width=9)}\n"  # 9**3 values and the lists holding them
    (tmp_path / "x.yaml").write_text(text)
    assert read_yaml(tmp_path / "x.yaml", "x.yaml") == yaml.safe_load(text)


@pytest.mark.parametrize(
    "text,says",
    [
        ("name: broken\nfamily: [mlp\n", "conf/model/broken.yaml: not valid YAML at line 3"),
        ("- 1\n- 2\n", "conf/model/broken.yaml: expected a mapping of preset fields, got list"),
        (preset(whatever=3), "conf/model/broken.yaml: unknown field 'whatever'"),
        (
            preset(family=None),
            "conf/model/broken.yaml: missing field 'family'; every preset sets name, family, "
            "display, resolution, architecture",
        ),
        (
            preset(family="mpl"),
            "conf/model/broken.yaml: family='mpl' is not valid (did you mean 'mlp'?); valid "
            "families: sana, ",
        ),
        (
            preset(architecture=[1, 2]),
            "conf/model/broken.yaml: architecture=[1, 2] is not valid; expected a mapping",
        ),
        (
            preset(architecture={"in_features": 64, "hidden_features": -3, "out_features": 64}),
            "conf/model/broken.yaml: architecture.hidden_features=-3 is not valid; expected a "
            "whole number >= 1",
        ),
        (
            preset(resolution="64"),
            "conf/model/broken.yaml: resolution='64' is not valid; expected a whole number >= 1",
        ),
        (
            preset(buckets=[[64, 64, 64]]),
            "conf/model/broken.yaml: buckets=[[64, 64, 64]] is not valid; expected a list of "
            "[height, width] pairs",
        ),
    ],
    ids=[
        "not yaml",
        "a list",
        "unknown field",
        "no family",
        "unknown family",
        "a list for a mapping",
        "negative width",
        "text for a number",
        "a bucket of three",
    ],
)
def test_a_broken_or_nonsense_preset_in_conf_model_is_one_line(
    tmp_path: Path, root: Path, monkeypatch: pytest.MonkeyPatch, text: str, says: str
) -> None:
    (root / "conf" / "model" / "broken.yaml").write_text(text)
    monkeypatch.setattr(autofit.paths, "_PACKAGE", root / "autofit")
    line = one_line(in_process("probe", "model=broken", "backend=simulate", cwd=tmp_path))
    assert line.startswith(f"autofit: error: {says}"), line
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "model,override,says",
    [
        ("tiny_sana", "model.architecture.num_layers=-3", "a whole number >= 1"),
        ("tiny_sana", "model.architecture.num_layers=2.5", "a whole number >= 1"),
        ("tiny_mlp", "model.architecture.hidden_features=0", "a whole number >= 1"),
        ("tiny_sana", "model.inputs.text_tokens=0", "a whole number >= 1"),
        ("llama3_2_1b", "model.architecture.config.num_hidden_layers=0", "a whole number >= 1"),
        ("sdxl", "model.architecture.block_out_channels=[320,0,1280]", "one per level"),
        ("tiny_sana", "model.companions.vae.architecture.latent_channels=-1", ">= 1"),
    ],
)
def test_an_architecture_size_below_1_is_refused_before_any_probe(
    tmp_path: Path, model: str, override: str, says: str
) -> None:
    line = one_line(in_process("probe", f"model={model}", override, cwd=tmp_path))
    setting, value = override.split("=")
    value = value.replace(",", ", ")  # a list as Python writes it
    assert line.startswith(f"autofit: error: {setting}={value} is not valid; expected "), line
    assert says in line, line
    assert not (tmp_path / "results").exists()


@pytest.mark.parametrize(
    "file,text,args",
    [
        (None, None, ["probe", "model=tiny_mlp", "precision=" + "x" * 10_000]),
        (None, None, ["probe", "model=tiny_sana", "model.architecture.num_layers=" + "x" * 10_000]),
        (
            "space.yaml",
            f"batch_size: {{min: 1, max: 4}}\nresolution: ['{'x' * 10_000}']\n",
            ["search", "model=tiny_mlp", "gpu=l4", "space=space.yaml"],
        ),
        (
            "card.yaml",
            CARD.replace("memory_mib: 23034", f"memory_mib: {'x' * 10_000}"),
            ["search", "model=tiny_mlp", "gpu=card.yaml"],
        ),
    ],
    ids=["knob override", "preset override", "space file", "card file"],
)
def test_an_error_quoting_a_huge_value_cuts_it(
    tmp_path: Path, file: str | None, text: str | None, args: list[str]
) -> None:
    if file and text:
        (tmp_path / file).write_text(text)
    line = one_line(in_process(*args, cwd=tmp_path))
    assert "xxxxxxxxxx... (10002 characters)" in line and len(line) < 300, line[:500]


@pytest.mark.parametrize(
    "override,says",
    [
        (
            "gpu.cuda_context_mib=inf",
            "gpu l4: cuda_context_mib=inf is not valid; expected a number",
        ),
        ("gpu.host_link_gbs=inf", "gpu l4: host_link_gbs=inf is not valid; expected a number > 0"),
        ("gpu.memory_mib=1" + "0" * 400, "gpu l4: memory_mib=1000"),
    ],
)
def test_a_gpu_figure_a_float_cannot_hold_is_refused_before_any_probe(
    tmp_path: Path, override: str, says: str
) -> None:
    line = one_line(in_process("probe", "model=tiny_mlp", "gpu=l4", override, cwd=tmp_path))
    assert line.startswith(f"autofit: error: {says}"), line
    assert not (tmp_path / "results").exists()


def test_a_space_of_more_combinations_than_autofit_searches_is_refused_at_once(
    tmp_path: Path,
) -> None:
    """Nine thousand combinations of a few values each: checked one by one before the first
    probe, they would take minutes; refused, the search costs nothing."""
    (tmp_path / "big.yaml").write_text(
        "batch_size: {min: 1, max: 8}\n"
        "knobs:\n"
        "  precision: [fp32, fp16, bf16, bf16_pure]\n"
        "  optimizer: [adamw, sgd, adamw8bit, lion, came, adafactor]\n"
        "  checkpointing: [false, true]\n"
        "  zero_stage: [0, 1, 2, 3]\n"
        "  lora_rank: [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16]\n"
        "  ema: [off, cpu, gpu]\n"
    )
    started = time.monotonic()
    line = one_line(
        in_process("search", "model=tiny_mlp", "gpu=a40", "space=big.yaml", cwd=tmp_path)
    )
    assert time.monotonic() - started < 5
    assert line == (
        "autofit: error: big.yaml: 4 x 6 x 2 x 4 x 16 x 3 x 1 = 9216 combinations of knob values "
        "and resolutions; autofit searches at most 5000 (a probe or more each): search fewer "
        "values, or split the space"
    ), line
    assert not (tmp_path / "results").exists()
