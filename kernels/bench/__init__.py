"""The benchmark harness behind ``python -m kernels.bench``, one concept per module.

``results`` (a row, the modes, the run's meta, JSON/CSV), ``timing`` (warm up, time calls,
spread, peak memory), ``sweep`` (input sets, the timed call of each mode, the sweep),
``comparison`` (interleaved rounds of a few callables), ``gpu_checks`` (the configs Triton's
autotuner chose), ``plots`` (scaling figures and the roofline), ``showdown`` (chapter 6's tables),
``cli`` (the command line).
"""
