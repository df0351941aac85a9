"""Shipping bakes the way they are used: registries (``push``, ``install docker://``), container
images built in a Docker daemon (``image``, ``build --image``) and Kubernetes manifests
(``k8s``).

Each module pulls in its own tool only when its command runs: skopeo for registries
(registry.py), the ``docker`` package for the Docker API (image.py, the ``docker`` extra),
PyYAML for manifests (k8s.py, the ``k8s`` extra).  Installing never needs any of them beyond
skopeo for a registry reference.
"""

# The path a server reads the bake at, inside every image and Pod this package writes
# (the same default as the bake root: cachebake.roles.DEFAULT_ROOT).
