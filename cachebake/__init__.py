"""cachebake: compile Triton kernels for a vLLM deployment once, at image-build time.

The data flows one way, one room a step, and no module imports a later one
(tests/test_layers.py holds the code to it):

    recipe -> capture -> bake -> artifact -> install -> serve -> verify

    errors, jsonio, roles, gpu,             the bottom: exit codes, strict JSON, where caches live,
    toolchain, fsops                        the GPU, the C toolchain, fd-relative file operations
    recipes                                 what is baked: a model's config and default serve args
    capture                                 the bake env, the compile monitor and the compile record
    vllm                                    the wing: everything that knows vLLM (its serve args,
                                            compile identity, engine driver, request plans, the
                                            before-start check, the Mamba2 ops driver and its plans)
    drivers, bake                           what runs one warmup round (registry, command driver,
                                            round child); build: rounds of a driver under the monitor
    artifact                                snapshot -> manifest -> layer -> OCI layout, and its reader
    install                                 put a bake where the server reads it, or refuse
    serve                                   what runs in the server: the serve command, the layered
                                            cache, the miss log
    verify                                  re-run a round against an installed bake; the check
    replay                                  the loop back: a record or served misses, compiled ahead
                                            of time into the next bake
    distribute                              registries, images, Kubernetes
    cli                                     parse, call one function, render

``cli`` only parses and renders.
"""

__version__ = "0.1.0"
