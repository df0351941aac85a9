"""The compile record and its replay: recompile what a bake compiled, ahead of time, on any
machine (no GPU), for any target, in parallel.

``record``   the record's data format (one entry per compile; autotune sets): stable, imported
             by other modules that log compiles (the serve-time miss log uses the same entry).
``recorder`` what the compile monitor calls to write entries while a warmup runs.
``worker``   decode one entry and compile it for a target (runs in worker processes).
``engine``   ``cachebake replay``: load a record, expand autotune candidates, compile in N
             processes into a fresh cache, carry autotune results, build launcher helpers, pack.
``seed``     the build's hook: seed the bake cache from a record before round 1; cross-target
             bakes.
``cross``    in-process patches for a cross-target warmup (Triton compiles for the requested
             target, launches are skipped, device name/capability answer for the target).
"""
