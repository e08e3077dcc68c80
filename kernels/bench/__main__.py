"""``python -m kernels.bench``: the benchmark's command line.

The options and examples are ``kernels.bench.cli``'s; this file only runs its ``main``
so that the package can be run as a module.

    python -m kernels.bench --help
"""
import sys

from kernels.bench.cli import main

sys.exit(main())
