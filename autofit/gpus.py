"""Target GPUs: the table entry a probe is measured or simulated against (`conf/gpu/<name>.yaml`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

MIB = 1 << 20


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model, as its YAML entry states it.

    `memory_mib` is the total the driver reports (nvidia-smi); the CUDA context comes out of it.
    `tflops` holds dense (not sparse) peak throughput per math mode: `fp32` (plain FP32, what
    PyTorch matmuls use by default), `tf32` (what cuDNN convolutions use by default), `fp16` and
    `bf16` (tensor cores, FP32 accumulation). `host_link_gbs` is the effective host-to-device
    bandwidth, for offload and block swap; `peer_link_gbs` the bus bandwidth a collective reaches
    between GPUs of one node (NVLink or PCIe), for ZeRO across GPUs. The two overheads are what a fake run cannot see:
    the CUDA context (outside PyTorch's allocator) and the cuBLAS workspace (inside it).
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
    notes: str = ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> GpuSpec:
        values = dict(data)
        values["tflops"] = {k: float(v) for k, v in dict(values["tflops"]).items()}
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def fingerprint(self) -> str:
        """A short hash of the whole entry: a changed entry measures again."""
        from autofit.fingerprint import fingerprint

        return fingerprint(self.to_dict())

    @property
    def memory_bytes(self) -> int:
        return self.memory_mib * MIB

    @property
    def cuda_context_bytes(self) -> int:
        return int(self.cuda_context_mib * MIB)

    @property
    def cublas_workspace_bytes(self) -> int:
        return int(self.cublas_workspace_mib * MIB)

    def budget_bytes(self, margin: float) -> int:
        """The memory a run may use: the GPU's memory less a safety margin (a fraction of it)."""
        return int(self.memory_bytes * (1.0 - margin))


def load_gpu(name: str) -> GpuSpec:
    """The shipped entry `conf/gpu/<name>.yaml`, read without composing a whole config."""
    import yaml

    from autofit.errors import ConfigError
    from autofit.paths import conf_dir, group_options

    path = conf_dir() / "gpu" / f"{name}.yaml"
    if not path.exists():
        raise ConfigError(f"unknown gpu '{name}'; valid: {', '.join(group_options('gpu'))}")
    return GpuSpec.from_dict(yaml.safe_load(path.read_text()))
