"""Chapter 5: FlashAttention written by hand in CUDA, and the tools that read its kernels.

``flash`` registers ``cuda_v1`` and ``cuda_v2`` and builds their extension on first use;
``ptxas`` runs nvcc and parses the resources ptxas logs; ``resources`` turns them into
occupancy and reads the PTX; ``design`` compiles cuda_v2 once per revision of its design;
``threads`` maps which thread computes which element (``kernels.notebook.show_lines`` cuts the
``.cu`` lines the book shows). The kernels themselves are in ``csrc/``; ``nvcc_snapshot.json`` holds one nvcc
run's resources for machines without nvcc.
"""
