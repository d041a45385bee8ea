"""Entry functions that end their process instead of returning a model, each its own way, for
tests/test_endings.py: autofit's up-front check must name what each did, in one line."""

import os
import signal
import sys
import time


def exits_at_once():
    os._exit(0)  # no cleanup, no exception: the process is simply gone


def calls_sys_exit():
    sys.exit(3)


def never_returns():
    while True:
        time.sleep(1)


def is_killed():
    os.kill(os.getpid(), signal.SIGKILL)  # as the kernel's out-of-memory killer would
