#!/usr/bin/env bash
# The container tests (README "Containers and Kubernetes") against real engines, on a CPU-only
# Debian machine as root: dockerd 20.10 (overlay2 or vfs storage, BuildKit), docker-registry 2.8 on
# 127.0.0.1, podman 4.3 (kube play), skopeo, kubernetes-validate.
#
# Every engine runs inside a network namespace of our own that has nothing but a loopback: the
# host's network is never touched (no bridge, no iptables rules), builds and containers use
# --network none, and the registry's 127.0.0.1 is the namespace's, which the Pod that podman
# plays shares (its --network host *is* that namespace): how an init container reaches a
# registry here.  Everything started here is stopped on exit, by PID.
#
# Base images come from Debian's archive (debootstrap), not from Docker Hub: a minimal Debian
# with python3, pip and skopeo plus cachebake's wheels from this checkout (pip reads them from
# /opt/wheels: PIP_FIND_LINKS, PIP_NO_INDEX), and a stand-in serving image that adds Triton and
# the AOT warmup (tests/kit/aot_kernels.py): real sm_90 kernels compiled without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
started=$(date +%s)
say() { echo "containers.sh: $* (+$(( $(date +%s) - started )) s)"; }

SUITE=trixie  # its python3 (3.13) has tarfile's PEP 706 filters, which install uses
TRITON=triton==3.6.0  # the test extra's Triton
DEB_CACHE=/var/cache/cachebake-ci/debootstrap  # .debs kept for the next run on this machine
WORK=$(mktemp -d "${TMPDIR:-/tmp}/cachebake-containers.XXXXXX")
chmod 755 "$WORK"
NS=cachebake-ci-$$
REGISTRY=127.0.0.1:5000  # inside $NS
# Debian's docker.io CLI (20.10: BuildKit built in); a newer docker CLI elsewhere on PATH wants buildx.
DOCKER=/usr/bin/docker

PACKAGES="docker.io podman catatonit runc docker-registry debootstrap skopeo iproute2 util-linux ca-certificates"
if ! dpkg -s $PACKAGES >/dev/null 2>&1; then
  # On a booted machine, installing docker.io and docker-registry would start their system
  # services (a docker0 bridge and iptables rules; a registry on every interface): deny service
  # starts for the install (invoke-rc.d's policy hook), as Debian's container images do.
  own_policy=
  if [ ! -e /usr/sbin/policy-rc.d ]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 755 /usr/sbin/policy-rc.d && own_policy=1
  fi
  rc=0
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends $PACKAGES >/dev/null; } || rc=$?
  [ -z "$own_policy" ] || rm -f /usr/sbin/policy-rc.d
  [ $rc -eq 0 ] || exit $rc
fi
# Not editable: the venv's copy is what uid 65534 imports when the checkout is out of its reach.
python3 -m pip install -q '.[test,docker,k8s]' kubernetes-validate

# Storage: overlay where the kernel lets us mount it (layers shared: a container starts in
# ~0.5 s), else vfs, which copies every layer (~10 s a container for a 1 GB image, GBs to delete).
STORAGE=vfs
mkdir -p "$WORK/ovl/lower" "$WORK/ovl/upper" "$WORK/ovl/work" "$WORK/ovl/merged"
if mount -t overlay overlay -o "lowerdir=$WORK/ovl/lower,upperdir=$WORK/ovl/upper,workdir=$WORK/ovl/work" \
     "$WORK/ovl/merged" 2>/dev/null; then
  umount "$WORK/ovl/merged"
  STORAGE=overlay
fi
rm -rf "$WORK/ovl"
DOCKER_STORAGE=$([ "$STORAGE" = overlay ] && echo overlay2 || echo vfs)
PODMAN="podman --runtime runc --root $WORK/podman/root --runroot $WORK/podman/run --storage-driver $STORAGE --cgroup-manager cgroupfs --events-backend file"
# runc under podman must not raise rlimits past what root may here (nofile 20000).
mkdir -p "$WORK/podman"
printf '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]\n' > "$WORK/podman/containers.conf"
export CONTAINERS_CONF="$WORK/podman/containers.conf"

inns() { nsenter --net="/run/netns/$NS" "$@"; }
stop_pid() {  # stop_pid FILE: SIGTERM the process whose pid FILE holds, wait up to 30 s
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -9 "$pid" 2>/dev/null || true
}
cleanup() {
  set +e
  $PODMAN pod rm -a -f >/dev/null 2>&1
  $PODMAN rm -a -f >/dev/null 2>&1
  $PODMAN volume rm -a -f >/dev/null 2>&1
  stop_pid "$WORK/registry.pid"
  stop_pid "$WORK/docker.pid"  # dockerd stops the containerd it started
  ip netns del "$NS" 2>/dev/null
  # a mount still busy under WORK makes rm fail: say so rather than claim it is gone
  if rm -rf "$WORK" 2>/dev/null && [ ! -e "$WORK" ]; then
    say "stopped dockerd, the registry and podman's pods; removed $WORK"
  else
    say "stopped dockerd, the registry and podman's pods; could not remove $WORK (a mount under it is still busy: $(findmnt -rno TARGET | grep -F "$WORK" | head -3 | tr '\n' ' '))"
  fi
}
trap cleanup EXIT

ip netns add "$NS"
ip -n "$NS" link set lo up

# dockerd: no iptables rules, no bridge
nsenter --net="/run/netns/$NS" dockerd --storage-driver="$DOCKER_STORAGE" --iptables=false --ip6tables=false --bridge=none \
  --host "unix://$WORK/docker.sock" --data-root "$WORK/docker" --exec-root "$WORK/docker-exec" \
  --pidfile "$WORK/docker.pid" >"$WORK/dockerd.log" 2>&1 &
export DOCKER_HOST="unix://$WORK/docker.sock"

cat >"$WORK/registry.yml" <<EOF
version: 0.1
log: {level: warn}
storage: {filesystem: {rootdirectory: $WORK/registry}, delete: {enabled: true}}
http: {addr: $REGISTRY}
EOF
# (nsenter itself, not the inns function: $! must be the registry's pid, not a subshell's)
nsenter --net="/run/netns/$NS" docker-registry serve "$WORK/registry.yml" >"$WORK/registry.log" 2>&1 &
echo $! >"$WORK/registry.pid"

# The base image's root filesystem, while the daemons start.
ROOTFS="$WORK/rootfs"
mkdir -p "$DEB_CACHE"
debootstrap --variant=minbase --include=python3,python3-pip,skopeo,netavark --cache-dir="$DEB_CACHE" \
  "$SUITE" "$ROOTFS" "${CACHEBAKE_CI_DEBIAN_MIRROR:-http://deb.debian.org/debian}" >"$WORK/debootstrap.log" 2>&1 \
  || { tail -20 "$WORK/debootstrap.log"; exit 1; }
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
  "$ROOTFS"/usr/share/doc/* "$ROOTFS"/usr/share/man/* "$ROOTFS"/usr/share/locale/*
PYV=$(chroot "$ROOTFS" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')
say "debootstrapped $SUITE (python $PYV)"

# Wheels for that Python: cachebake from this checkout, its dependencies, Triton.
mkdir -p "$ROOTFS/opt/wheels" "$WORK/serving"
python3 -m pip wheel -q --no-deps -w "$ROOTFS/opt/wheels" .
PLATFORM="--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64"
python3 -m pip download -q --only-binary=:all: --python-version "$PYV" --implementation cp $PLATFORM \
  -d "$ROOTFS/opt/wheels" click zstandard rich cryptography
python3 -m pip download -q --only-binary=:all: --no-deps --python-version "$PYV" --implementation cp \
  $PLATFORM -d "$WORK/serving" "$TRITON"

for _ in $(seq 60); do $DOCKER version >/dev/null 2>&1 && break; sleep 0.5; done
$DOCKER version --format 'dockerd {{.Server.Version}}'; say "storage: $DOCKER_STORAGE"
tar -C "$ROOTFS" -c . | $DOCKER import \
  --change 'ENV PIP_NO_INDEX=1' --change 'ENV PIP_FIND_LINKS=/opt/wheels' \
  --change 'ENV PIP_BREAK_SYSTEM_PACKAGES=1' --change 'ENV PIP_ROOT_USER_ACTION=ignore' \
  --change 'ENV PIP_DISABLE_PIP_VERSION_CHECK=1' --change 'CMD ["python3"]' \
  - cachebake-ci/base:test >/dev/null
rm -rf "$ROOTFS"

# The stand-in serving image: base + Triton + the AOT warmup (a vLLM image in real use).
cp tests/kit/aot_kernels.py "$WORK/serving/"
cat >"$WORK/serving/Dockerfile" <<'EOF'
FROM cachebake-ci/base:test
RUN --mount=type=bind,source=.,target=/w python3 -m pip install -q --no-cache-dir /w/triton-*.whl
COPY aot_kernels.py /opt/cachebake-ci/aot_kernels.py
EOF
DOCKER_BUILDKIT=1 $DOCKER build -q --network=none -t cachebake-ci/serving:test "$WORK/serving" >/dev/null
say "images: $($DOCKER images --format '{{.Repository}}:{{.Tag}} {{.Size}}' | tr '\n' ' ')"

# The tests make cachebake's wheel as README says (`pip wheel --no-deps .`), inside the
# namespace, which has no route to PyPI: the build backend pyproject.toml names comes from here.
mkdir -p "$WORK/build-backend"
python3 -m pip download -q --only-binary=:all: -d "$WORK/build-backend" 'setuptools>=77'
export PIP_NO_INDEX=1 PIP_FIND_LINKS="$WORK/build-backend"
export CACHEBAKE_TEST_CONTAINERS=1 CACHEBAKE_TEST_DOCKER_CLI=$DOCKER \
  CACHEBAKE_TEST_REGISTRY=$REGISTRY CACHEBAKE_TEST_REGISTRY_DIR="$WORK/registry" \
  CACHEBAKE_TEST_BASE_IMAGE=cachebake-ci/base:test CACHEBAKE_TEST_SERVING_IMAGE=cachebake-ci/serving:test \
  CACHEBAKE_TEST_PODMAN="$PODMAN" CACHEBAKE_TEST_PRIVATE_NETNS=1
inns python3 -m pytest -q -rs -m containers "$@"
say "container tests done"
