"""``cachebake`` sign, verify-signature, keygen, k8s-policy: who may put code in a serving pod
(docs/trust.md)."""

from __future__ import annotations

import click

from cachebake.cli.app import JSON_OPTION, main, output
from cachebake.cli.params import K8S_NAME

VERIFY_KEY_HELP = ("A trusted public key: a PEM file, or the PEM text itself (repeatable; any "
                   "one verifying is enough).")


def registry_options(f):
    f = click.option("--authfile", type=click.Path(dir_okay=False),
                     help="Registry credentials (docker config.json format; default: skopeo's search).")(f)
    return click.option("--tls-verify/--no-tls-verify", default=None,
                        help="Require HTTPS (default: yes, except loopback registries).")(f)


@main.command()
@click.argument("reference")
@click.option("--key", "key", required=True, type=click.Path(dir_okay=False),
              help="The signing key: PEM, ECDSA P-256 (password: $CACHEBAKE_SIGN_PASSWORD).")
@registry_options
@JSON_OPTION
def sign(reference, key, tls_verify, authfile, as_json):
    """Sign a pushed image with a key, offline, as cosign does.

    REFERENCE is docker://HOST/REPO:TAG or @sha256:... (a tag is resolved to its digest once).
    Writes cosign's signature (tag sha256-<hex>.sig, appended to) and a Sigstore bundle
    referrer; an index is signed with each image it lists."""
    from cachebake.distribute.registry import RegistryOptions
    from cachebake.distribute.sign import sign_reference

    output(as_json).emit(sign_reference(reference, key, RegistryOptions(tls_verify, authfile)))


@main.command("verify-signature")
@click.argument("reference")
@click.option("--key", "verify_keys", multiple=True, help=VERIFY_KEY_HELP)
@click.option("--policy", type=click.Path(dir_okay=False),
              help='A JSON policy file: {"keys": [{"name": ..., "pem": ...}, ...]}.')
@registry_options
@JSON_OPTION
def verify_signature(reference, verify_keys, policy, tls_verify, authfile, as_json):
    """Check that a trusted key signed an image.

    The digest REFERENCE names now must carry a signature by one of the keys (exit 13 if not)."""
    from cachebake.distribute.registry import RegistryOptions
    from cachebake.distribute.sign import trusted_keys, verify_reference
    from cachebake.errors import UsageError

    if not verify_keys and not policy:
        raise UsageError("give --key or --policy")
    output(as_json).emit(verify_reference(reference, trusted_keys(verify_keys, policy),
                                          RegistryOptions(tls_verify, authfile)))


@main.command()
@click.argument("prefix")
@JSON_OPTION
def keygen(prefix, as_json):
    """Make an ECDSA P-256 signing key pair.

    PREFIX.key (PKCS#8 PEM, mode 0600) and PREFIX.pub."""
    from cachebake.distribute.keys import generate, load_public_key

    key_path, pub_path = generate(prefix)
    out = output(as_json)
    out.emit(_KeygenReport(str(key_path), str(pub_path), load_public_key(str(pub_path)).fingerprint))


class _KeygenReport:
    def __init__(self, key, pub, fingerprint):
        self.key, self.pub, self.fingerprint = key, pub, fingerprint

    def to_dict(self):
        return {"key": self.key, "pub": self.pub, "fingerprint": self.fingerprint}

    def render(self, console):
        console.print(f"wrote {self.key} (keep it secret) and {self.pub} ({self.fingerprint})",
                      markup=False, soft_wrap=True)


@main.command("k8s-policy")
@click.option("--engine", type=click.Choice(["policy-controller", "kyverno"]), required=True,
              help="sigstore policy-controller's ClusterImagePolicy, or a Kyverno ImageValidatingPolicy.")
@click.option("--key", "verify_keys", multiple=True, required=True, help=VERIFY_KEY_HELP)
@click.option("--image", "images", multiple=True, required=True,
              help="Image pattern the policy covers, e.g. registry.example/bakes/* (repeatable).")
@click.option("--name", default="cachebake-bakes", show_default=True, type=K8S_NAME, help="The policy's name.")
@click.option("--format", "fmt", type=click.Choice(["yaml", "json"]), default=None,
              help="Output format (default: yaml, or json where PyYAML is not installed).")
@JSON_OPTION
def k8s_policy(engine, verify_keys, images, name, fmt, as_json):
    """Write a policy admitting only images the keys signed.

    An admission policy for sigstore policy-controller or Kyverno; it covers containers, init containers and image volumes (volumes[].image.reference)."""
    from cachebake.distribute.k8s import ManifestReport, default_format, render
    from cachebake.distribute.policy import admission_policy
    from cachebake.distribute.sign import trusted_keys

    doc, notes = admission_policy(engine, trusted_keys(verify_keys, None), list(images), name)
    if fmt is None:
        fmt, why = default_format()
        if why:
            notes.append(why)
    output(as_json).emit(ManifestReport(render(doc, notes, fmt), doc, notes))
