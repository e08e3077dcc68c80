"""Chapter 4: FlashAttention-2 in Triton, and what the compiler makes of it.

``flash`` (the forward kernel, the autograd Function, the registry entry), ``backward``
(the backward kernels), ``launch`` (Triton or its stand-in, buffers, size arguments),
``configs`` (the autotuner's configs and their pruning), ``interpreter`` (running the kernels
without a GPU), ``tiling`` (the tile map figure), ``compile_sweep`` (what every config costs
on a GPU, compiled without one).

Without a CUDA GPU the kernels run in Triton's interpreter, on CPU tensors. Triton reads its
switch, ``TRITON_INTERPRET``, when ``@triton.jit`` decorates a kernel, so it is set here,
before any kernel of the course is defined, and for the whole process: kernels a reader
defines afterwards are interpreted too. A value the user set is kept, and where a GPU is
visible nothing is set.
"""
import os

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
