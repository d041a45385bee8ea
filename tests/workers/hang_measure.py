"""The real worker, with a backend that starts a grandchild, records both pids in
$AUTOFIT_TEST_PIDFILE ("worker grandchild"), then never finishes: only a kill ends it."""

import os
import subprocess
import sys
import time

from autofit.probe import worker


def hang(spec, backend):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    with open(os.environ["AUTOFIT_TEST_PIDFILE"], "w") as f:
        f.write(f"{os.getpid()} {child.pid}")
    while True:
        time.sleep(1)


worker.measure = hang
raise SystemExit(worker.main())
