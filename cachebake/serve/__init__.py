"""The serving side: what runs inside the server's processes, and the command that starts it.

- ``command``: ``cachebake serve-args``: the ``vllm serve`` command and environment that match a
  bake;
- ``layered``: a Triton cache manager that reads the baked tree read-only and writes misses to
  a writable overlay (or to memory), so a miss never crashes a server whose cache is read-only;
- ``overlay``: that overlay, private to the server's uid (made 0700) or refused, opened by fd
  without following links;
- ``misslog``: one JSON line per miss, from every process of every replica (the offline side,
  ``cachebake misses`` and fold-back, is cachebake.replay's);
- ``vllm_plugin``: the ``vllm.general_plugins`` entry point that turns both the monitor and
  the layered cache on in vLLM's engine and worker processes.

The variables that point a server at its caches and its overlay are cachebake.roles' (install
hands them out, and install comes before the server).  This module stays import-light: the
vLLM plugin imports it in every process.
"""

# "triton": read the baked tree exactly as Triton's own FileCacheManager does (the absolute
# paths in group files, partial groups as they are), still writing misses to the overlay.
# verify uses it: its verdict must be the one a server with Triton's manager would get.
READS_ENV = "CACHEBAKE_LAYERED_READS"
# Where the downward API puts a pod's identity, by the usual convention (the manifests in
# README's Kubernetes section set them); HOSTNAME is the pod name anyway on Kubernetes.
POD_ENV = {"POD_NAME": "pod", "POD_NAMESPACE": "namespace", "NODE_NAME": "node"}
