"""The vLLM wing: everything in cachebake that knows vLLM, and nothing else does.

bake, serve and verify call into it; it calls only the rooms below ``bake`` (the bottom,
``recipes``, ``capture``), so what it knows of one vLLM release has one home:

    serveargs       vLLM's serve args: the dialect, ``resolve``, the server's flags and identity env
    identity        vLLM's torch.compile identity: its hash factors, path factors, outcome in a log
    engine          the ``vllm`` driver: vLLM's own engine with dummy weights, under the monitor
    request_plan    the requests the engine driver sends (what start-up warm-ups miss)
    compile_check   the before-start check (``verify --check-only``): would this server hit the bake
    kernels/        the ``kernels`` driver: vLLM's Mamba2 ops at model shapes, with engine plans
"""
