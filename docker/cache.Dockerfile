# The cache image: FROM scratch, one bake installed at the serving root, nothing else.
# `cachebake image ART --tag TAG [--push]` builds exactly this through the Docker API
# (cachebake/distribute/image.py, CACHE_DOCKERFILE).  By hand:
#   cachebake install ART --to ctx/rootfs/var/cache/cachebake --serve-at /var/cache/cachebake \
#       --fingerprint FP_OF_THE_SERVING_IMAGE
#   docker build -f docker/cache.Dockerfile -t TAG ctx
# A serving Dockerfile takes it with
#   COPY --from=TAG /var/cache/cachebake /var/cache/cachebake
# (the root Dockerfile's `cache` stage builds the same thing on a GPU builder).
FROM scratch
COPY rootfs/ /
