"""RealLayoutFakeMode's dispatch-cache key (autofit/simulator/kernel_outputs.py) tells apart exactly
the arguments FakeTensorMode's own key tells apart, and a step traced with its key and its outputs
from the cache is the step traced with FakeTensorMode's."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensorMode, _CacheKeyState

from autofit.fastpath.scan import TracedPoint
from autofit.probe.worker import versions
from autofit.simulator.kernel_outputs import RealLayoutFakeMode
from tests.helpers import spec

aten = torch.ops.aten


def _keys(mode: RealLayoutFakeMode, args: Any) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """The args' part of the key, as the mode writes it and as FakeTensorMode writes it."""
    ours: list[object] = []
    theirs: list[object] = []
    mode._prep_args_for_hash(ours, args, _CacheKeyState(None), [])
    FakeTensorMode._prep_args_for_hash(mode, theirs, args, _CacheKeyState(None), [])
    return tuple(ours), tuple(theirs)


def _arguments() -> list[Callable[[], Any]]:
    """Argument lists that differ in one fact each from another of them."""
    base = lambda: torch.empty(5, 4)  # noqa: E731
    complex_ = lambda: torch.empty(4, dtype=torch.complex64)  # noqa: E731

    def inference() -> torch.Tensor:
        with torch.inference_mode():
            return torch.empty(4, 4)

    return [
        lambda: (torch.empty(4, 4),),
        lambda: (torch.empty(4, 4, dtype=torch.bfloat16),),  # dtype
        lambda: (torch.empty(4, 5),),  # shape
        lambda: (torch.empty(4, 4).t(),),  # the same shape and storage, strides
        lambda: (base()[0:4],),  # storage bytes: 80 rather than 64
        lambda: (base()[1:5],),  # storage offset
        lambda: (torch.empty(4, 4, requires_grad=True),),
        lambda: (torch.empty(4, 4, device="cuda"),),  # device
        lambda: (inference(),),
        lambda: (torch.empty(2, 3, 4, 4).to(memory_format=torch.channels_last),),
        lambda: (torch.empty(2, 3, 4, 4),),
        lambda: (complex_(),),
        lambda: (complex_().conj(),),  # conjugate bit
        lambda: (complex_()._neg_view(),),  # negative bit
        lambda: (torch.empty(4, 4), 1),
        lambda: (torch.empty(4, 4), 1.0),  # the same value, another type
        lambda: (torch.empty(4, 4), True),
        lambda: (torch.empty(4, 4), None),
        lambda: ([torch.empty(4, 4), torch.empty(4, 4)], 0),
        lambda: ([torch.empty(4, 4)], 0),
        lambda: ((torch.empty(4, 4),), 0),
        lambda: (torch.empty(4, 4), torch.Size([4, 4])),
        lambda: (torch.empty(4, 4), [4, 4]),
        lambda: (torch.empty(4, 4), torch.float16),
        lambda: (torch.empty(4, 4), {"dtype": torch.float16}),
        lambda: (torch.empty(4, 4), "mean"),
    ]


def test_the_key_tells_apart_what_fake_tensor_modes_key_tells_apart() -> None:
    mode = RealLayoutFakeMode()
    with mode:
        first = [make() for make in _arguments()]
        again = [make() for make in _arguments()]  # the same facts, other tensors
    keys = [_keys(mode, args) for args in first + again]
    for (ours_a, theirs_a), (ours_b, theirs_b) in itertools.combinations(keys, 2):
        assert (ours_a == ours_b) == (theirs_a == theirs_b)
    count = len(first)
    for index in range(count):  # the same facts: the same key
        assert keys[index][0] == keys[count + index][0]
    assert len({ours for ours, _ in keys}) == count


def test_tensors_of_another_mode_are_keyed_by_fake_tensor_mode() -> None:
    """A fake tensor of another mode is not this mode's to key: FakeTensorMode's code says the
    op cannot be cached, as it says for its own key."""
    from torch._subclasses.fake_tensor import _BypassDispatchCache

    with FakeTensorMode():
        other = torch.empty(4)
    mode = RealLayoutFakeMode()
    for write in (
        mode._prep_args_for_hash,
        lambda *a: FakeTensorMode._prep_args_for_hash(mode, *a),
    ):
        try:
            write([], (other,), _CacheKeyState(None), [])
        except _BypassDispatchCache as exc:
            assert "not our fake" in str(exc.reason)
        else:
            raise AssertionError("a tensor of another mode was keyed")


def test_an_op_is_answered_from_the_cache_with_the_key() -> None:
    mode = RealLayoutFakeMode()
    with mode:
        x, y, other_x, other_y = (torch.empty(*shape) for shape in [(3, 7), (7, 2)] * 2)
        torch.mm(x, y)
        hits, misses = FakeTensorMode.cache_hits, FakeTensorMode.cache_misses
        out = torch.mm(other_x, other_y)
    assert (FakeTensorMode.cache_hits, FakeTensorMode.cache_misses) == (hits + 1, misses)
    assert out.shape == (3, 2) and out.untyped_storage().nbytes() == 3 * 2 * 4


def test_a_traced_step_is_the_same_with_fake_tensor_modes_own_cache(monkeypatch: Any) -> None:
    """The key, and the outputs made from the cache (`_get_output_tensor_from_cache_entry`):
    the same step as with FakeTensorMode's, views and in-place ops included."""
    probe = spec("tiny_sana", batch_size=3, optimizer="came", checkpointing=True)
    found = versions()
    ours = TracedPoint(probe, found).record
    for name in ("_prep_args_for_hash", "_get_output_tensor_from_cache_entry"):
        monkeypatch.setattr(RealLayoutFakeMode, name, getattr(FakeTensorMode, name))
    theirs = TracedPoint(probe, found).record
    assert (ours.structure, ours.parts, ours.rates) == (
        theirs.structure,
        theirs.parts,
        theirs.rates,
    )
    assert ours.numbers.tolist() == theirs.numbers.tolist()


def test_an_output_from_the_cache_is_the_output_of_the_op() -> None:
    """Each op twice: the first dispatched, the second made from its cache entry; the two
    outputs alike in layout, conjugate and negative bits, and storage (a view's is its
    input's)."""
    ops = {
        "t": lambda x, c: x.t(),
        "view": lambda x, c: x.view(6, 4),
        "slice": lambda x, c: x[1:],
        "mm": lambda x, c: x @ x.t(),
        "permute_clone": lambda x, c: x.permute(1, 0).contiguous(),
        "conj_view": lambda x, c: c.conj().view(2, 2),  # keeps the conjugate bit
        "neg_view": lambda x, c: c._neg_view().view(2, 2),
        "add_": lambda x, c: x.add_(1.0),
    }
    mode = RealLayoutFakeMode()
    with mode:
        for name, op in ops.items():
            outputs = []
            for _ in range(2):
                x, c = torch.empty(4, 6), torch.empty(4, dtype=torch.complex64)
                hits = FakeTensorMode.cache_hits
                out = op(x, c)
                outputs.append((
                    out.shape, out.stride(), out.storage_offset(), out.is_conj(), out.is_neg(),
                    out.untyped_storage().nbytes(),
                    out.untyped_storage()._cdata in (x.untyped_storage()._cdata, c.untyped_storage()._cdata),
                ))  # fmt: skip
            assert FakeTensorMode.cache_hits > hits, name  # the second came from the cache
            assert outputs[0] == outputs[1], name
