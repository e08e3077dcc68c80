"""The attention implementations of chapters 1-3, 7, 8 and 10, one module each.

``naive`` (chapter 1), ``inplace`` (2), ``sdpa`` (3: SDPA with its backend pinned),
``torch_compile`` (7: compiled naive and FlexAttention), ``block`` (8: a transformer block
around any registered attention), ``decoding`` (10: the KV cache and one token's cost).
Each registers its implementations with ``kernels.registry`` on import.
"""
