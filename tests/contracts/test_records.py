"""The shared records sit on the ground floor: importing them loads no torch and none of autofit
above them (only the GPU entry a spec carries, and what reading it needs), so every layer can pass
them without importing another layer."""

from __future__ import annotations

import subprocess
import sys

GROUND = {
    "autofit",
    "autofit.errors",
    "autofit.fingerprint",  # the GPU entry's hash: hashlib and json, nothing of autofit
    "autofit.gpus",
    "autofit.paths",
    "autofit.yaml_files",
}


def test_the_records_import_no_torch_and_nothing_of_autofit_above_them() -> None:
    code = (
        "import sys, pkgutil, importlib, autofit.records as r\n"
        "for m in pkgutil.iter_modules(r.__path__): importlib.import_module(f'autofit.records.{m.name}')\n"
        "print('torch' in sys.modules)\n"
        "print(' '.join(sorted(m for m in sys.modules if m.startswith('autofit'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    torch_loaded, modules = done.stdout.splitlines()
    assert torch_loaded == "False"
    loaded = set(modules.split())
    assert {m for m in loaded if not m.startswith("autofit.records")} <= GROUND, loaded
