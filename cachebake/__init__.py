"""cachebake: compile Triton kernels for a vLLM deployment once, at image-build time.

The data flows one way, one module a step:
recipe -> capture.env -> drivers -> capture.monitor -> artifact.snapshot -> artifact.manifest
-> artifact.layer / artifact.oci -> install -> runtime -> verify.  ``cli`` only parses and renders.
"""

__version__ = "0.1.0"
