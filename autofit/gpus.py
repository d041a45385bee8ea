"""Target GPUs: the table entry a probe is measured or simulated against (`conf/gpu/<name>.yaml`,
or a user's own file in the same format, `gpu=path/to/card.yaml`)."""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path
from typing import Any

from autofit.errors import ConfigError, shown, suggest
from autofit.fingerprint import fingerprint
from autofit.paths import NAME, conf_dir, group_options
from autofit.yaml_files import read_yaml

MIB = 1 << 20
MATH_MODES = ("fp32", "tf32", "fp16", "bf16")
_CAPABILITY = re.compile(r"\d+\.\d+\Z")
# A card's memory as people write it after its name: rtx4060ti_8, a100-80gb, 4090 24GB.
_MEMORY_SUFFIX = re.compile(
    r"(?P<base>.+?)(?:[_\- ](?P<gb>\d{1,3})(?:gb)?|(?P<gb2>\d{1,3})gb)\Z", re.I
)
# The NVMe drive ZeRO-Infinity offloads to, in the machine the card sits in, unless its entry
# says otherwise: one NVMe SSD on PCIe 4.0 x4. Samsung 990 PRO's datasheet gives 7.45 GB/s
# sequential read and 6.9 GB/s sequential write; the lower, since a step's reads and writes share
# the drive. (The ZeRO-Infinity paper, Rajbhandari et al. 2021, counts about 25 GB/s per DGX-2
# node, from several drives: `gpu.nvme_gbs=25`.)
NVME_GBS = 6.9


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model, as its YAML entry states it.

    `memory_mib` is the total the driver reports (nvidia-smi); the CUDA context comes out of it.
    `tflops` holds dense (not sparse) peak throughput per math mode: `fp32` (plain FP32, what
    PyTorch matmuls use by default), `tf32` (what cuDNN convolutions use by default), `fp16` and
    `bf16` (tensor cores, FP32 accumulation); `fp32` and `fp16` are required, `bf16` is there
    exactly when `bf16` is true. `host_link_gbs` is the effective host-to-device bandwidth, for
    offload and block swap; `peer_link_gbs` the bus bandwidth a collective reaches between GPUs
    of one node (NVLink or PCIe), for ZeRO across GPUs; `nvme_gbs` the NVMe drive's bandwidth in
    the machine the card sits in, for ZeRO-Infinity's NVMe offload. The two overheads are what a
    fake run cannot see: the CUDA context (outside PyTorch's allocator) and the cuBLAS workspace
    (inside it). `reserved_mib` is memory something else holds on this card (a display, other
    processes): it comes out of every budget. `tensor_cores` is false for a card without them
    (before Volta, and the GTX 16 series): it has no TF32 and no bf16, and PyTorch's 16-bit
    matmuls, which accumulate in fp32, run on its FP32 units: autofit prices them at `fp32`.
    `host_memory_gib` is the RAM of a typical machine this card sits in, and `host_memory_basis`
    says which machine, in a few words: the host budget of a run simulated for this card when
    `host_memory_gib=` is not set (autofit/host.py). Every shipped entry states both (its
    source in the file's comments); a card file may leave them out (no host limit then).
    """

    name: str
    display: str
    memory_mib: int
    compute_capability: str
    bf16: bool
    tflops: dict[str, float]
    memory_bandwidth_gbs: float
    peer_link_gbs: float
    host_link_gbs: float
    cuda_context_mib: float
    cublas_workspace_mib: float
    reserved_mib: int = 0
    nvme_gbs: float = NVME_GBS
    tensor_cores: bool = True
    host_memory_gib: float | None = None
    host_memory_basis: str = ""
    notes: str = ""

    @classmethod
    def from_dict(cls, data: Any, source: str = "gpu") -> GpuSpec:
        """The entry `data` states, every field checked; a ConfigError names `source` (where
        the entry came from), the field, its value and what it may be."""
        if not isinstance(data, dict):
            raise ConfigError(
                f"{source}: expected a mapping of GPU fields, got {_kind(data)}; "
                f"fields: {', '.join(FIELDS)}"
            )
        # Every mistake at once: a card file is written by hand, fixed in one go.
        unknown = [key for key in data if key not in FIELDS]
        missing = [key for key in REQUIRED if key not in data]
        problems = [f"unknown field {shown(k)}{suggest(str(k), list(FIELDS))}" for k in unknown]
        if missing:
            named = ", ".join(f"'{k}'" for k in missing)
            problems.append(f"missing field{'s' if len(missing) > 1 else ''} {named}")
        problems += [
            f"{key}={shown(value)} is not valid; expected {_RULES[key][1]}"
            for key, value in data.items()
            if key in FIELDS and not _RULES[key][0](value)
        ]
        if problems:
            tail = (
                f"; every GPU entry sets {', '.join(REQUIRED)}"
                if missing
                else f"; valid fields: {', '.join(FIELDS)}"
                if unknown
                else ""
            )
            raise ConfigError(f"{source}: " + "; ".join(problems) + tail)
        values = dict(data)
        values["tflops"] = {k: float(v) for k, v in data["tflops"].items()}
        values["compute_capability"] = _capability(data["compute_capability"])
        if data.get("host_memory_gib") is not None:
            values["host_memory_gib"] = float(data["host_memory_gib"])
        spec = cls(**values)
        spec._check_together(source)
        return spec

    def _check_together(self, source: str) -> None:
        if ("bf16" in self.tflops) != self.bf16:
            has = "sets" if "bf16" in self.tflops else "lacks"
            raise ConfigError(
                f"{source}: bf16={str(self.bf16).lower()} but tflops {has} bf16; a GPU with "
                "bf16 gives its bf16 TFLOPS, one without (before Ampere) gives none"
            )
        if not self.tensor_cores and {"tf32", "bf16"} & set(self.tflops):
            extra = " and ".join(sorted({"tf32", "bf16"} & set(self.tflops)))
            raise ConfigError(
                f"{source}: tensor_cores=false but tflops gives {extra}; a card without tensor "
                "cores has neither (give fp32 and its fp16 figure only)"
            )
        if self.host_memory_basis and self.host_memory_gib is None:
            raise ConfigError(
                f"{source}: host_memory_basis is set but host_memory_gib is not; give the GiB "
                "of RAM the machine it names has"
            )
        if self.reserved_mib >= self.memory_mib:
            raise ConfigError(
                f"{source}: reserved_mib={self.reserved_mib} is not valid; expected less than "
                f"memory_mib={self.memory_mib}"
            )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fingerprint(self) -> str:
        """A short hash of the whole entry: a changed entry measures again. A field at its
        default is left out, so an entry written before the field existed keeps its hash; so is
        the machine around the card (HOST_FIELDS), which changes no measurement of the card: the
        host budget a probe was judged against is in its key on its own."""
        return fingerprint(
            {
                k: v
                for k, v in self.to_dict().items()
                if DEFAULTS.get(k, MISSING) != v and k not in HOST_FIELDS
            }
        )

    @property
    def label(self) -> str:
        """The name a study carries: the entry's name when it is the shipped entry of that name,
        else the name and a short hash of its figures (`rtx4090+3fa9c2`), so that a card file or
        an overridden field never shares a study with the card it differs from."""
        try:
            if load_gpu(self.name) == self:
                return self.name
        except ConfigError:
            pass
        return f"{self.name}+{self.fingerprint()[:6]}"

    @property
    def capability(self) -> tuple[int, int]:
        """The compute capability as numbers, (8, 9) for '8.9'."""
        major, minor = self.compute_capability.split(".")
        return int(major), int(minor)

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    @property
    def host_memory_bytes(self) -> int | None:
        """The RAM of a typical machine this card sits in (bytes); None where not stated."""
        return None if self.host_memory_gib is None else int(self.host_memory_gib * (1 << 30))

    @property
    def reserved_bytes(self) -> int:
        return self.reserved_mib * MIB

    @property
    def cuda_context_bytes(self) -> int:
        return int(self.cuda_context_mib * MIB)

    @property
    def cublas_workspace_bytes(self) -> int:
        return int(self.cublas_workspace_mib * MIB)

    def budget_bytes(self, margin: float) -> int:
        """The memory a run may use: the GPU's memory less a safety margin (a fraction of it) and
        less what something else holds on the card (`reserved_mib`)."""
        budget = int(self.memory_bytes * (1.0 - margin)) - self.reserved_bytes
        if budget <= 0:
            raise ConfigError(
                f"gpu {self.name}: reserved_mib={self.reserved_mib} and margin={margin} leave no "
                f"memory of its {self.memory_mib} MiB; lower either"
            )
        return budget


FIELDS = {f.name: f for f in fields(GpuSpec)}
DEFAULTS = {f.name: f.default for f in fields(GpuSpec) if f.default is not MISSING}
REQUIRED = [name for name in FIELDS if name not in DEFAULTS]
HOST_FIELDS = ("host_memory_gib", "host_memory_basis")  # the machine the card sits in
# What `gpu.<field>=<value>` may name.
FIELD_PATHS = [k for k in FIELDS if k != "tflops"] + [f"tflops.{m}" for m in MATH_MODES]
# Each field's check and the words saying what it may be.
_NUMBER = (lambda v: _is_number(v) and v > 0, "a number > 0")
_SIZE = (lambda v: _is_number(v) and v >= 0, "a number of MiB >= 0")
_RULES: dict[str, tuple[Any, str]] = {
    "name": (lambda v: isinstance(v, str) and bool(NAME.match(v)),
             "letters, digits, '_', '.' and '-', e.g. rtx4090_laptop"),
    "display": (lambda v: isinstance(v, str), "text, e.g. NVIDIA GeForce RTX 4090"),
    "memory_mib": (lambda v: _is_int(v) and v > 0,
                   "a whole number of MiB > 0, the total nvidia-smi reports"),
    "compute_capability": (lambda v: _capability(v) is not None, "major.minor, e.g. '8.9'"),
    "bf16": (lambda v: isinstance(v, bool), "true or false"),
    "tflops": (lambda v: isinstance(v, dict) and {"fp32", "fp16"} <= set(v) <= set(MATH_MODES)
               and all(_is_number(x) and x > 0 for x in v.values()),
               f"a mapping of {', '.join(MATH_MODES)} to dense TFLOPS > 0, fp32 and fp16 required"),
    "memory_bandwidth_gbs": _NUMBER,
    "peer_link_gbs": _NUMBER,
    "host_link_gbs": _NUMBER,
    "nvme_gbs": _NUMBER,
    "cuda_context_mib": _SIZE,
    "cublas_workspace_mib": _SIZE,
    "reserved_mib": (lambda v: _is_int(v) and v >= 0,
                     "a whole number of MiB >= 0, what a display or other processes hold"),
    "tensor_cores": (lambda v: isinstance(v, bool), "true or false (false before Volta)"),
    "host_memory_gib": (lambda v: v is None or (_is_number(v) and v > 0),
                        "a number of GiB > 0, the RAM of a typical machine this card sits in"),
    "host_memory_basis": (lambda v: isinstance(v, str),
                          "text: which machine host_memory_gib describes"),
    "notes": (lambda v: isinstance(v, str), "text"),
}  # fmt: skip


def _kind(data: Any) -> str:
    return "nothing (an empty file)" if data is None else type(data).__name__


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and _is_number(value)


def _is_number(value: Any) -> bool:
    """An int or a float that a float holds: YAML's .inf and .nan, or an int of 400 digits, are
    no figure of a GPU (its sizes become ints of bytes, its speeds divide)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:  # an int past a float's range
        return False


def _capability(value: Any) -> str | None:
    """`'8.9'` as written; a number (YAML's unquoted 8.9) as its text."""
    text = str(value) if _is_number(value) else value
    return text if isinstance(text, str) and _CAPABILITY.match(text) else None


def load_gpu(name: str) -> GpuSpec:
    """The shipped entry `conf/gpu/<name>.yaml`, read without composing a whole config."""
    path = conf_dir() / "gpu" / f"{name}.yaml"
    if not path.exists():
        valid = group_options("gpu")
        raise ConfigError(
            f"unknown gpu {shown(name)}{gpu_suggestion(name)}; valid: {', '.join(valid)}"
        )
    return load_gpu_file(path, source=f"conf/gpu/{name}.yaml")


def memory_class(spec: GpuSpec) -> int:
    """The card's memory as its name states it: whole GB (GiB of the driver's total, rounded)."""
    return round(spec.memory_mib / 1024)


def gpu_suggestion(name: str) -> str:
    """The words an unknown `gpu=` gets: the entries it most likely means, those of the memory
    it names first (`rtx4060_16` means the 16 GB RTX 4060 Ti), or, where no entry is near, that
    the card has none and how to give one."""
    options = group_options("gpu")
    match = _MEMORY_SUFFIX.match(name)
    base = match.group("base") if match else name
    gb = int(match.group("gb") or match.group("gb2")) if match else None
    near = [o for o in options if base and o.lower().startswith(base.lower())]
    if not near:  # the card's own name without its maker's prefix: a6000, 4090
        near = [o for o in options if len(base) >= 3 and base.lower() in o.lower()]
    if not near:
        near = difflib.get_close_matches(name, options, n=1, cutoff=0.8)  # a typo, not another card
    if gb is not None:
        same = [o for o in near if memory_class(load_gpu(o)) == gb]
        near = same or near
    if not near:
        return (
            ": autofit has no entry for that card; give it as a file, gpu=path/to/card.yaml "
            "(docs/gpus.md has a whole one)"
        )
    if len(near) > 3:
        return suggest(name, options)
    if gb is None and all(_another_model(base, o) for o in near):
        # rtx4070ti is not rtx4070tisuper_16: name each card and its memory, and the way out
        cards = [f"'{o}' ({load_gpu(o).display}, {memory_class(load_gpu(o))} GB)" for o in near]
        return (
            f" (autofit has {' and '.join(cards)}, another card; for yours give it as a file, "
            "gpu=path/to/card.yaml, docs/gpus.md has a whole one)"
        )
    quoted = [f"'{o}'" for o in near]
    listed = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f" (did you mean {listed}?)"


def _another_model(base: str, entry: str) -> bool:
    """Whether `entry` names another model of the card `base` starts: more of its name follows,
    in letters (rtx4070ti, rtx4070tisuper_16), not its memory (rtx4060ti, rtx4060ti_16)."""
    rest = entry[len(base) :] if entry.lower().startswith(base.lower()) else ""
    return bool(rest) and rest[0].isalpha()


def is_gpu_file(value: Any) -> bool:
    """Whether `gpu=<value>` names a file of the user's rather than a shipped entry."""
    return isinstance(value, str) and value.endswith((".yaml", ".yml"))


def load_gpu_file(path: Path, source: str | None = None) -> GpuSpec:
    """A GPU entry from a YAML file, checked field by field."""
    source = source or f"gpu={path}"
    if not path.is_file():
        raise ConfigError(
            f"{source}: no such file (a path to a GPU entry .yaml, relative to {Path.cwd()})"
        )
    return GpuSpec.from_dict(read_yaml(path, source), source)
