"""Chapter 4: FlashAttention-2 in Triton, and what the compiler makes of it.

``flash`` (the forward kernels, the autograd Function, the registry entry), ``backward``
(the backward kernels), ``launch`` (Triton or its stand-in, buffers, size arguments),
``tiles`` (tile sizes and the autotuner's configs), ``interpreter`` (running the kernels
without a GPU), ``tiling`` (the tile map figure), ``compile_sweep`` (what every config costs
on a GPU, compiled without one).
"""
