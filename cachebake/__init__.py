"""cachebake: compile Triton kernels for a vLLM deployment once, at image-build time.

The data flows one way, one room a step, and no module imports a later one
(tests/test_layers.py holds the code to it):

    errors, jsonio, roles, gpu,             the bottom: exit codes, strict JSON, where caches live,
    toolchain, fsops                        the GPU, the C toolchain, fd-relative file operations
    recipes, serveargs                      what is baked: a model's config and its serve args
    capture                                 the bake env, the compile monitor and the compile record
    artifact                                snapshot -> manifest -> layer -> OCI layout, and its reader
    plan                                    what vLLM's engine hands the Mamba2 kernels
    drivers                                 what runs one warmup round (vllm, kernels, a command)
    install                                 put a bake where the server reads it, or refuse
    serve                                   what runs in the server: the serve command, the layered
                                            cache, the miss log
    replay                                  compile a record (or served misses) ahead of time
    bake                                    build and verify: rounds of a driver under the monitor
    distribute                              registries, images, Kubernetes
    cli                                     parse, call one function, render

``cli`` only parses and renders.
"""

__version__ = "0.1.0"
