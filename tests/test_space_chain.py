"""Every shipped space answers on every shipped card, for every model family, with and without a
trainer (issue 41 item 2): a search of `space=quick` (or of the spaces it goes on to where
nothing fits, `if_nothing_fits`) always has a run to measure, so it ends with a best run or a
measured "nothing fits", never "nothing to search". Checked without a probe, as the search
checks a space before its first: every combination's invalid reason and what the search leaves
out. What each answers, measured on full-size models, is benchmarks/quick_everywhere.py's."""

from __future__ import annotations

import pytest

from autofit.commands.search import _for_trainer, left_out_by
from autofit.errors import ConfigError
from autofit.export import TARGETS
from autofit.gpus import load_gpu
from autofit.knobs import defaults, invalid_reason
from autofit.models import load_preset
from autofit.paths import group_options
from autofit.search.space import load_space

# The smallest preset of each family autofit ships (the toys aside).
SMALLEST = {
    "sana": "sana_600m", "sd3": "sd35_medium", "sd3_controlnet": "sd3_controlnet",
    "sdxl": "sdxl", "sdxl_controlnet": "sdxl_controlnet", "flux": "flux_dev", "chroma": "chroma",
    "llm": "llama3_2_1b", "wan": "wan2_1_t2v_1_3b", "hunyuan_video": "hunyuan_video",
    "qwen_image": "qwen_image", "sd": "sd15", "pixart_sigma": "pixart_sigma_512",
    "flux_kontext": "flux_kontext_dev", "qwen_image_edit": "qwen_image_edit",
}  # fmt: skip


# Trainers that launch no run of the family's smallest model on a card without bf16, by what they
# are: LLaMA-Factory loads Llama 3.2's weights in their published bf16 (torch_dtype auto), which
# such a card computes in fp16 only through a cast copy of each weight that the measured run
# did not hold; its refusal is the search's one line.
NO_RUN_WITHOUT_BF16 = {("llm", "llamafactory")}


def _smallest_per_memory_class() -> list[str]:
    """The shipped card of least memory in each class of 8, 12, 16, 24, 48 and 80+ GB (and every
    card without bf16, whose precisions differ)."""
    cards = [load_gpu(name) for name in group_options("gpu")]
    chosen = {card.name for card in cards if not card.bf16}
    for low, high in ((0, 9), (9, 13), (13, 17), (17, 25), (25, 50), (50, 10_000)):
        within = [c for c in cards if low * 1024 < c.memory_mib <= high * 1024]
        if within:
            chosen.add(min(within, key=lambda c: c.memory_mib).name)
    return sorted(chosen)


def _runnable(space, gpu, preset, trainer=None) -> int:  # type: ignore[no-untyped-def]
    left_out = left_out_by(space, gpu, trainer, preset)
    count = 0
    for resolution in space.resolutions:
        for combination in space.combinations():
            knobs = {**defaults(), **combination, "resolution": resolution}
            if invalid_reason(knobs, gpu, preset, "simulate") is None and left_out(knobs) is None:
                count += 1
    return count


def test_the_classes_cover_the_cards_people_start_on() -> None:
    cards = _smallest_per_memory_class()
    assert {"rtx4060_8", "rtx3080_10", "t4", "v100_16", "rtx2080ti"} <= set(cards), cards


@pytest.mark.parametrize("family", sorted(SMALLEST))
def test_quick_and_the_spaces_it_goes_on_to_have_a_run_on_every_card(family: str) -> None:
    preset = load_preset(SMALLEST[family])
    trainers: list[str | None] = [None]
    for name, chosen in TARGETS.items():
        if chosen.trains(family):
            try:  # a trainer of the family may refuse a model of it, in one line
                chosen.check_family(preset, setting="trainer")
            except ConfigError as refusal:
                assert "\n" not in str(refusal) and preset.name in str(refusal)
                continue
            trainers.append(name)
    for card in _smallest_per_memory_class():
        gpu = load_gpu(card)
        for trainer in trainers:
            name, seen, runs = "quick", [], 0
            while name is not None:  # quick, then each if_nothing_fits
                space = load_space(name, preset)
                chosen, _, _, space = _for_trainer(trainer, preset, space, gpu)
                runs = _runnable(space, gpu, preset, chosen)
                seen.append(name)
                name = space.if_nothing_fits
                assert name not in seen
            assert seen == ["quick", "small_cards_lora"]
            # the last space has runs to measure: where quick has none (or none fits), the
            # search goes on to one that has; but for a trainer that computes in no dtype the
            # card has, whose search says so in its one line
            if (family, trainer) in NO_RUN_WITHOUT_BF16 and not gpu.bf16:
                assert runs == 0, (card, trainer, "runs now: drop the exception")
            else:
                assert runs > 0, (card, trainer, seen[-1])
