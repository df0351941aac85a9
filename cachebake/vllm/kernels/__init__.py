"""The ``kernels`` driver: vLLM's Mamba2 Triton ops alone, at the shapes, strides and batch
classes vLLM's engine hands them (``plan/``: the engine plan vLLM computes; ``plans/``: the stored
plans per recipe; ``driver``: the sweep a round runs)."""
