#!/bin/sh
# Installs cachebake in an image build (Dockerfile's serving-cachebake stage,
# docker/installer.Dockerfile), from the build context bind-mounted at $1:
#
#   CACHEBAKE_PIP empty (the default): the one wheel dist/cachebake-*.whl of the checkout, made
#     there first with `python3 -m pip wheel --no-deps -w dist .` (cachebake is not on PyPI);
#     its dependencies (click, zstandard, rich) come from the image's pip index;
#   CACHEBAKE_PIP set: what pip installs from it (e.g. cachebake==0.1.0 once published, a URL).
set -eu
context=$1
if [ -n "${CACHEBAKE_PIP:-}" ]; then
    # word splitting on purpose: CACHEBAKE_PIP may hold several pip arguments
    # shellcheck disable=SC2086
    python3 -m pip install --no-cache-dir $CACHEBAKE_PIP
else
    set -- "$context"/dist/cachebake-*.whl
    [ -f "$1" ] || set --  # the pattern itself: no wheel
    if [ "$#" -ne 1 ]; then
        echo "install-cachebake: the build context needs exactly one dist/cachebake-*.whl, it has $#:" \
             "run 'rm -rf dist && python3 -m pip wheel --no-deps -w dist .' in the checkout, or" \
             "--build-arg CACHEBAKE_PIP=SPEC" >&2
        exit 1
    fi
    python3 -m pip install --no-cache-dir "$1"
fi
cachebake --version
