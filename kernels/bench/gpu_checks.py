"""What a GPU benchmark row records beside its times: ``chosen_configs``, the Triton configs the
autotuner picked for the last call. On a CPU (the interpreter does not autotune) it is None;
nothing here fails for lack of a GPU or Triton.
"""
from __future__ import annotations

import json
import sys
from typing import Optional

# Where each autotuned kernel lives: (module, attribute).
TRITON_KERNELS = {"fwd": ("kernels.triton.flash", "attn_fwd_tuned"),
                  "bwd_dkdv": ("kernels.triton.backward", "attn_bwd_dkdv_tuned"),
                  "bwd_dq": ("kernels.triton.backward", "attn_bwd_dq_tuned")}


def chosen_configs(name: str) -> Optional[str]:
    """The configs Triton's autotuner chose in the last call of ``name`` (JSON), or None.

    Only the ``triton`` implementation is autotuned; in the interpreter it is not (its
    kernels are plain functions without ``best_config``), and then this is None too.
    """
    if name != "triton":
        return None
    # Read from the modules only if they are loaded: asking must not import Triton.
    chosen = {}
    for short, (module, attr) in TRITON_KERNELS.items():
        config = getattr(getattr(sys.modules.get(module), attr, None), "best_config", None)
        if config is not None:
            chosen[short] = {**config.kwargs, "num_warps": config.num_warps, "num_stages": config.num_stages}
    return json.dumps(chosen, sort_keys=True) if chosen else None


