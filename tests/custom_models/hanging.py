"""A custom model whose training step never ends, for the signal tests (tests/test_signals.py):
its loss starts a grandchild, writes "<probe pid> <grandchild pid>" to a new file in
$AUTOFIT_TEST_HANG_DIR, then sleeps. Everything it starts runs in the search's folder, which is
how the tests find what is left."""

import os
import subprocess
import sys
import time

import torch
from torch import nn

from autofit.workloads.custom import CustomModel


def build() -> CustomModel:
    model = nn.Sequential(nn.Linear(8, 8))

    def make_batch(batch_size, resolution, device, dtype):
        return {"x": torch.randn(batch_size, 4, 8, device=device, dtype=dtype)}

    def loss(model, batch):
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        folder = os.environ["AUTOFIT_TEST_HANG_DIR"]
        with open(os.path.join(folder, f"{os.getpid()}.pids"), "w") as f:
            f.write(f"{os.getpid()} {child.pid}")
        while True:
            time.sleep(1)

    return CustomModel(model=model, make_batch=make_batch, loss=loss)
