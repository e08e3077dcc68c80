"""Chapter 11: attention with the sequence sharded over the ranks of a process group.

``ranks`` (run a function on N processes in one group, gloo or NCCL), ``ring`` (ring
attention), ``ulysses`` (all-to-all sequence parallelism), ``programs`` (what each rank
runs in the chapter), ``rank_traces`` (a folder of per-rank profiler traces, read side by side).
"""
