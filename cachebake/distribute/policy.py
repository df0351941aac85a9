"""Admission policies that admit only bake images a trusted key signed: the cluster-side twin of
``install --verify-key``, for the image-volume pattern (where the kubelet, not cachebake, pulls
the bake) and for the installer and serving images themselves.

* sigstore policy-controller: a ``ClusterImagePolicy`` (policy.sigstore.dev/v1beta1), one
  ``key`` authority per key (``key.data``: the PEM), ``signatureFormat: legacy`` (cosign's
  ``.sig`` tag, what ``cachebake sign`` writes).  No ``ctlog``: policy-controller then skips
  the transparency log (no Rekor client: webhook/validator.go), which is what an air-gapped
  cluster needs.  It checks containers, init containers and image volumes
  (``checkVolumeImages``).
* Kyverno: an ``ImageValidatingPolicy`` (policies.kyverno.io/v1beta1, Kyverno >= 1.14), one
  ``cosign`` attestor per key (``key.data``), ``ctlog.insecureIgnoreTlog`` (offline).  Its
  built-in Pod image extraction does not read ``volumes[].image.reference`` yet (kyverno PR
  #17555), so the policy declares its own CEL extractor (``spec.images``) that lists the
  containers', init containers', ephemeral containers' and image volumes' images, and
  validates every one that ``matchImageReferences`` matches.

Both are built as data; ``cachebake k8s-policy`` writes them with k8s.render (a serializer)."""

from __future__ import annotations

from cachebake.distribute.keys import PublicKey
from cachebake.errors import BadInput

ENGINES = ("policy-controller", "kyverno")
# Every image a Pod names, image volumes included: Kyverno's CEL extractor (module docstring).
POD_IMAGES_CEL = (
    "(has(object.spec.containers) ? object.spec.containers.map(c, c.image) : [])"
    " + (has(object.spec.initContainers) ? object.spec.initContainers.map(c, c.image) : [])"
    " + (has(object.spec.ephemeralContainers) ? object.spec.ephemeralContainers.map(c, c.image) : [])"
    " + (has(object.spec.volumes) ? object.spec.volumes.filter(v, has(v.image)).map(v, v.image.reference) : [])")
POD_IMAGES = "podImages"


def _check_images(images: list[str]) -> None:
    for pattern in images:
        if not pattern or any(c.isspace() or ord(c) < 0x20 for c in pattern) or len(pattern) > 512:
            raise BadInput(f"--image {pattern!r}: an image pattern is one word, e.g. registry.example/bakes/*")


def cluster_image_policy(keys: list[PublicKey], images: list[str], name: str) -> dict:
    return {"apiVersion": "policy.sigstore.dev/v1beta1", "kind": "ClusterImagePolicy",
            "metadata": {"name": name},
            "spec": {"images": [{"glob": g} for g in images],
                     "authorities": [{"name": f"key-{i}", "key": {"data": k.pem, "hashAlgorithm": "sha256"},
                                      "signatureFormat": "legacy"} for i, k in enumerate(keys)]}}


def kyverno_policy(keys: list[PublicKey], images: list[str], name: str) -> dict:
    names = [f"key{i}" for i in range(len(keys))]
    attestors = ", ".join(f"attestors.{n}" for n in names)
    return {"apiVersion": "policies.kyverno.io/v1beta1", "kind": "ImageValidatingPolicy",
            "metadata": {"name": name},
            "spec": {"validationActions": ["Deny"], "failurePolicy": "Fail",
                     "matchConstraints": {"resourceRules": [{
                         "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE", "UPDATE"],
                         "resources": ["pods"]}]},
                     "matchImageReferences": [{"glob": g} for g in images],
                     "images": [{"name": POD_IMAGES, "expression": POD_IMAGES_CEL}],
                     "attestors": [{"name": n, "cosign": {"key": {"data": k.pem, "hashAlgorithm": "sha256"},
                                                          "ctlog": {"insecureIgnoreTlog": True,
                                                                    "insecureIgnoreSCT": True}}}
                                   for n, k in zip(names, keys)],
                     "validations": [{
                         "expression": f"images.{POD_IMAGES}.map(image, verifyImageSignatures(image, "
                                       f"[{attestors}])).all(e, e > 0)",
                         "message": "a bake image must be signed by a trusted key (cachebake sign)"}]}}


def admission_policy(engine: str, keys: list[PublicKey], images: list[str], name: str) -> tuple[dict, list[str]]:
    """(the policy document, notes for its header)."""
    if not keys:
        raise BadInput("an admission policy needs at least one key")
    _check_images(images)
    fingerprints = ", ".join(k.fingerprint for k in keys)
    notes = [f"admits only {', '.join(images)} signed by: {fingerprints}",
             "offline: no transparency log is consulted (docs/trust.md says what a signature promises)"]
    if engine == "policy-controller":
        notes.append("sigstore policy-controller: label each namespace policy.sigstore.dev/include=true")
        return cluster_image_policy(keys, images, name), notes
    if engine == "kyverno":
        notes.append("Kyverno >= 1.14 (ImageValidatingPolicy); image volumes through the policy's own "
                     "CEL extractor until Kyverno extracts them itself (kyverno PR #17555)")
        return kyverno_policy(keys, images, name), notes
    raise BadInput(f"--engine {engine!r}: one of {', '.join(ENGINES)}")
