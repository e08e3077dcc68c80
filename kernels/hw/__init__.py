"""What the hardware offers, as numbers a chapter can compute with.

``devices``: the datasheet peaks (FLOP/s, bytes/s) of the GPUs the course names, and the
CPU's, with where each number came from. ``occupancy``: how many warps a kernel's
footprint (threads, registers, shared memory) lets an SM keep resident, as
NVIDIA's occupancy calculator computes it.
"""
