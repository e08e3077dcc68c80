"""``python -m kernels.trace.attention TRACE [B] ...``: see ``kernels.trace.attention.command``."""
import sys

from kernels.trace.attention.command import main

sys.exit(main())
