"""The `allocator` knob: the expandable-segments model of the CUDA caching allocator against the
default one on logs whose reserved bytes can be worked out by hand, and the setting reaching the
probe worker's environment and the probe's result."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import spec

from autofit.errors import ConfigError
from autofit.knobs import REGISTRY
from autofit.knobs.allocator import environment
from autofit.probe.launcher import ForkServer, Launcher, SpawnLauncher
from autofit.probe.runner import run_probe
from autofit.simulator.allocator import MODELS, ExpandableSegmentsModel
from autofit.simulator.allocator_replay import replay, required_memory

MIB = 1 << 20
TESTS = Path(__file__).parent


def _allocated_peak(events: list[int], sizes: list[int], persistent: list[int]) -> int:
    live = peak = sum(persistent)
    for event in events:
        live += sizes[event] if event >= 0 else -sizes[~event]
        peak = max(peak, live)
    return peak


# Each request a little larger than the last, each freed before the next: the default allocator
# cannot reuse a cached segment for a larger request and strands every one of them; one growing
# segment reuses its pages.
GROWING = [12 * MIB + 2 * MIB * i for i in range(10)]  # 12 .. 30 MiB
GROWING_EVENTS = [e for i in range(len(GROWING)) for e in (i, ~i)]


def test_the_default_model_strands_what_expandable_segments_reuse() -> None:
    default = replay(GROWING_EVENTS, GROWING, persistent=[512])
    expandable = replay(GROWING_EVENTS, GROWING, persistent=[512], allocator="expandable_segments")
    # Default: a 2 MiB small segment, then a segment per request (12 + 14 + ... + 30 MiB).
    assert default.peak_reserved_bytes == 2 * MIB + sum(GROWING)
    # Expandable: the small pool's 2 MiB page, and the 30 MiB peak in 20 MiB pages (40 MiB).
    assert expandable.peak_reserved_bytes == 2 * MIB + 40 * MIB
    assert expandable.segments == 2  # one per pool


def test_pages_are_two_mib_in_the_small_pool_and_twenty_in_the_large() -> None:
    model = ExpandableSegmentsModel()
    for _ in range(4096):  # 4096 x 512 B fill one 2 MiB page exactly
        model.malloc(512)
    assert model.reserved == 2 * MIB
    model.malloc(512)
    assert model.reserved == 4 * MIB
    model.malloc(1 * MIB + 512)  # the large pool maps its first 20 MiB page
    assert model.reserved == 4 * MIB + 20 * MIB
    model.malloc(19 * MIB)  # 1 MiB short of the page's free rest: one more page
    assert model.reserved == 4 * MIB + 40 * MIB


def test_the_growing_end_is_used_last() -> None:
    model = ExpandableSegmentsModel()
    hole = model.malloc(6 * MIB)
    model.malloc(4 * MIB)  # 10 MiB of the first page used; 10 MiB free at the segment's end
    model.free(hole)  # a 6 MiB hole at the start
    model.malloc(5 * MIB)  # fits both; goes into the hole, keeping the end to grow
    model.malloc(10 * MIB)  # so this still fits the end without a new page
    assert model.reserved == 20 * MIB


def test_freed_pages_are_unmapped_when_memory_runs_short() -> None:
    # 30 MiB and 10 MiB fill two 20 MiB pages; the 30 MiB is freed, a 35 MiB request comes.
    sizes = [30 * MIB, 10 * MIB, 35 * MIB]
    events = [0, 1, ~0, 2]
    assert replay(events, sizes, allocator="expandable_segments").peak_reserved_bytes == 80 * MIB
    # Under 60 MiB: the hole's one whole free page (0-20 MiB) is unmapped, 20 MiB stay mapped
    # (20-30 MiB free, the 10 MiB block), and 35 MiB map as two pages after them: 60 MiB.
    assert replay(events, sizes, limit=60 * MIB, allocator="expandable_segments").oom_event is None
    assert replay(events, sizes, limit=58 * MIB, allocator="expandable_segments").oom_event == 3
    need = required_memory(events, sizes, [], 64 * MIB, "expandable_segments")
    assert (need.reserved_when_plentiful, need.fits) == (80 * MIB, True)
    assert 58 * MIB < need.required <= 60 * MIB


def _random_log(seed: int) -> tuple[list[int], list[int]]:
    rng = random.Random(seed)
    sizes: list[int] = []
    events: list[int] = []
    live: list[int] = []
    for _ in range(300):
        if live and rng.random() < 0.45:
            events.append(~live.pop(rng.randrange(len(live))))
        else:
            kind = rng.random()
            size = (
                rng.randrange(1, 2048) * 512
                if kind < 0.5
                else rng.randrange(2049, 20480) * 512
                if kind < 0.8
                else rng.randrange(20480, 200000) * 512
            )
            live.append(len(sizes))
            events.append(len(sizes))
            sizes.append(size)
    return events, sizes


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("allocator", sorted(MODELS))
def test_never_less_than_the_allocated_peak(seed: int, allocator: str) -> None:
    events, sizes = _random_log(seed)
    allocated = _allocated_peak(events, sizes, [4 * MIB])
    plentiful = replay(events, sizes, [4 * MIB], allocator=allocator)
    assert plentiful.peak_reserved_bytes >= allocated
    need = required_memory(events, sizes, [4 * MIB], allocated // 2, allocator)
    assert not need.fits and need.required >= allocated
    # The least limit that works does work, and 2 MiB less does not.
    assert replay(events, sizes, [4 * MIB], need.required, allocator).oom_event is None


@pytest.mark.parametrize("seed", range(6))
def test_expandable_segments_hold_less_under_a_limit_on_these_logs(seed: int) -> None:
    """Not a law (20 MiB pages can cost more than 2 MiB rounding), but on mixed logs the
    fragmentation the default model strands outweighs the page rounding."""
    events, sizes = _random_log(seed)
    allocated = _allocated_peak(events, sizes, [])
    default = required_memory(events, sizes, [], allocated, "default")
    expandable = required_memory(events, sizes, [], allocated, "expandable_segments")
    assert expandable.required <= default.required


def test_every_knob_value_has_a_model_and_an_environment() -> None:
    knob = REGISTRY["allocator"]
    assert knob.default == "default"
    assert set(knob.choices or ()) == set(MODELS)
    assert environment("default") == {}
    assert environment("expandable_segments") == {
        "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"
    }
    with pytest.raises(ConfigError, match="allocator='expandable'.*valid values: default, "):
        knob.parse("expandable")


@pytest.fixture(params=["spawn", "forkserver"])
def launcher(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Launcher]:
    monkeypatch.setenv("PYTHONPATH", str(TESTS))
    # The user's shell asks for another setting: the knob's value wins.
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:128")
    if request.param == "spawn":
        yield SpawnLauncher()
    else:
        with ForkServer(preload=["autofit.probe.worker"]) as server:
            yield server


@pytest.mark.parametrize(
    "value,seen",
    [("default", ""), ("expandable_segments", "expandable_segments:True")],
)
def test_the_worker_starts_with_the_setting(launcher: Launcher, value: str, seen: str) -> None:
    result = run_probe(
        spec("tiny_mlp", allocator=value), worker="workers.environment", launcher=launcher
    )
    assert f"PYTORCH_CUDA_ALLOC_CONF={seen!r}" in (result.error or {}).get("message", "")


@pytest.mark.slow
def test_the_setting_reaches_the_simulated_result() -> None:
    """A probe's reserved peak is its step's allocation log replayed through the knob's model:
    a wide MLP's batch of 8192 strands ~400 MiB of default segments, not of expandable ones."""
    from autofit.backends.simulate import trace

    probes = {v: spec("tiny_mlp", batch_size=8192, allocator=v) for v in sorted(MODELS)}
    _, tracker = trace(probes["default"])
    workspace = probes["default"].gpu_spec.cublas_workspace_bytes
    reserved = {}
    for value, probe in probes.items():
        result = run_probe(probe)
        assert result.outcome.value == "ok", result.error
        assert result.config["allocator"] == value
        expected = replay(tracker.events, tracker.sizes, [workspace], allocator=value)
        assert result.peak_reserved_bytes == expected.peak_reserved_bytes
        assert result.peak_allocated_bytes == tracker.peak + workspace  # the same tensors
        reserved[value] = result.peak_reserved_bytes
    assert reserved["expandable_segments"] < reserved["default"]


def _export(target: str, allocator: str, out: Path, **knobs: object):
    from autofit.export import TARGETS
    from autofit.export.point import StudyPoint
    from autofit.knobs import defaults
    from autofit.models import load_preset

    preset = load_preset("sdxl")
    point = StudyPoint(
        study="allocator", summary_path=Path("allocator/summary.json"), preset=preset,
        gpu="a40", backend="simulate", label="best",
        config={**defaults(), "resolution": preset.resolution, "optimizer_impl": "foreach", "allocator": allocator, **knobs},
        peak_bytes=1, budget_bytes=2, samples_per_s=1.0,
    )  # fmt: skip
    return TARGETS[target].run(point, out)


@pytest.mark.parametrize("target", ["accelerate", "diffusers"])
def test_launch_commands_set_the_variable(target: str, tmp_path: Path) -> None:
    plan = _export(target, "expandable_segments", tmp_path)
    assert plan.command.startswith("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True ")
    if target == "diffusers":
        assert (
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True accelerate launch"
            in (plan.files["launch.sh"])
        )
    assert "PYTORCH_CUDA_ALLOC_CONF" not in _export(target, "default", tmp_path).command


@pytest.mark.parametrize("target", ["kohya", "simpletuner"])
def test_trainers_without_a_launch_variable_get_a_note(target: str, tmp_path: Path) -> None:
    # SimpleTuner trains bf16 weights under autocast; kohya runs the default precision.
    knobs = {"precision": "bf16_autocast"} if target == "simpletuner" else {}
    plan = _export(target, "expandable_segments", tmp_path, **knobs)
    assert any("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in n for n in plan.notes)
    plain = _export(target, "default", tmp_path, **knobs)
    assert not any("PYTORCH_CUDA_ALLOC_CONF" in n for n in plain.notes)


def _required_replaying_each(
    events: list[int], sizes: list[int], persistent: list[int], limit: int, allocator: str
) -> tuple[int, int, bool, int | None]:
    """required_memory as its definition reads: every replay from the first event."""
    plentiful = replay(events, sizes, persistent, allocator=allocator).peak_reserved_bytes
    if plentiful <= limit:
        return plentiful, plentiful, True, None
    capped = replay(events, sizes, persistent, limit, allocator)
    fits = capped.oom_event is None
    works, fails = (limit, 0) if fits else (plentiful, limit)
    while works - fails > 2 * MIB:
        middle = (works + fails) // 2
        if replay(events, sizes, persistent, middle, allocator).oom_event is None:
            works = middle
        else:
            fails = middle
    return plentiful, works, fits, capped.oom_event


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("allocator", sorted(MODELS))
def test_replays_that_go_on_from_a_copy_answer_as_replays_from_the_start(
    seed: int, allocator: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """required_memory's replays under a limit go on from a copy of the plentiful replay taken
    where the limit first matters; the answers are those of replaying each from the start, at
    limits below, at and above the allocated peak, and with persistent allocations over it."""
    import autofit.simulator.allocator_replay as allocator_module

    events, sizes = _random_log(seed)
    persistent = [4 * MIB]
    allocated = _allocated_peak(events, sizes, persistent)
    copies = []
    copied = allocator_module._Progress.resumed
    monkeypatch.setattr(
        allocator_module._Progress,
        "resumed",
        lambda self, cap: copies.append(cap) or copied(self, cap),
    )
    for limit in (allocated // 2, allocated - 3 * MIB, allocated, allocated + 7 * MIB, 2 * MIB):
        need = required_memory(events, sizes, persistent, limit, allocator)
        expected = _required_replaying_each(events, sizes, persistent, limit, allocator)
        assert (need.reserved_when_plentiful, need.required, need.fits, need.oom_event) == expected
    assert copies  # the copies were gone on from, not only made
