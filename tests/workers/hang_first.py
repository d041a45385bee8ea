"""The real worker, except that the first run (no $AUTOFIT_TEST_FLAG file yet) creates the flag,
records its pid in $AUTOFIT_TEST_PIDFILE and hangs; later runs probe normally. With
$AUTOFIT_TEST_ALWAYS set, every run hangs."""

import os
import time

from autofit.probe import worker

flag = os.environ["AUTOFIT_TEST_FLAG"]
if os.environ.get("AUTOFIT_TEST_ALWAYS") or not os.path.exists(flag):
    open(flag, "a").close()
    with open(os.environ["AUTOFIT_TEST_PIDFILE"], "w") as f:
        f.write(str(os.getpid()))
    while True:
        time.sleep(1)
raise SystemExit(worker.main())
