"""Debian's docker-registry 2.8 on 127.0.0.1 in a temp dir, and small OCI images pushed to it
with skopeo: what the signing tests (tests/test_distribute_sign*.py) sign and verify."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

from cachebake.distribute import sign
from cachebake.distribute.registry import RegistryOptions, RegistryRef


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_registry(root: Path):
    """host:port of a docker-registry serving from ``root``, stopped on exit; a skip where
    docker-registry or skopeo is missing."""
    exe = shutil.which("docker-registry")
    if not exe or not shutil.which("skopeo"):
        pytest.skip("needs docker-registry and skopeo (apt-get install docker-registry skopeo; .ci/run does)")
    port = _free_port()
    (root / "reg.yml").write_text(json.dumps({
        "version": 0.1, "log": {"level": "warn"},
        "storage": {"filesystem": {"rootdirectory": str(root / "data")}, "delete": {"enabled": True}},
        "http": {"addr": f"127.0.0.1:{port}"}}))  # JSON is YAML
    with open(root / "reg.log", "wb") as log:
        proc = subprocess.Popen([exe, "serve", str(root / "reg.yml")], stdout=log, stderr=log)
        try:
            for _ in range(100):
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if proc.poll() is not None:
                        pytest.fail((root / "reg.log").read_text())
                    time.sleep(0.1)
            yield f"127.0.0.1:{port}"
        finally:
            proc.terminate()
            proc.wait(30)


def push_image(registry: str, repo: str, tag: str, content: bytes, tmp: Path) -> str:
    """A small OCI image (one layer) pushed with skopeo; its manifest digest."""
    layout = sign.Layout(tmp / f"img-{tag}")
    layer = layout.blob(content, "application/vnd.oci.image.layer.v1.tar")
    config = layout.blob(json.dumps({"architecture": "amd64", "os": "linux",
                                     "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]}}).encode(),
                         sign.OCI_CONFIG)
    _, desc = layout.manifest({"schemaVersion": 2, "mediaType": sign.OCI_MANIFEST, "config": config,
                               "layers": [layer]}, tag)
    layout.push(tag, RegistryRef(registry, repo, tag), RegistryOptions())
    return desc["digest"]


def raw_manifest(ref: str) -> bytes:
    """The manifest ``ref`` (docker://...) names, as the registry sends it."""
    return subprocess.run(["skopeo", "inspect", "--raw", "--tls-verify=false", ref],
                          capture_output=True, check=True).stdout
