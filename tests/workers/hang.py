"""Starts a grandchild, records its pid, then never finishes: the runner must kill both."""

import os
import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
with open(os.environ["AUTOFIT_TEST_PIDFILE"], "w") as f:
    f.write(str(child.pid))
print("worker hanging", flush=True)
while True:
    time.sleep(1)
