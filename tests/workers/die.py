"""Dies without writing a result, after saying something on stderr."""

import os
import sys

print("worker: about to die on purpose", file=sys.stderr, flush=True)
os._exit(3)
