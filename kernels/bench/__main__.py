"""``python -m kernels.bench``: the benchmark's command line (``kernels.bench.cli``)."""
import sys

from kernels.bench.cli import main

sys.exit(main())
