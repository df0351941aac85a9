"""The keys a bake is signed and verified with: ECDSA P-256 in PEM, as stock verifiers take them.

``cosign verify --key``, Kyverno's ``publicKeys`` and sigstore policy-controller's ``key.data``
all read a PEM ``PUBLIC KEY`` (SubjectPublicKeyInfo); ECDSA P-256 with SHA-256 is the one scheme
cosign's signature spec requires every implementation to support (specs/SIGNATURE_SPEC.md,
"Signature Schemes").  So that is the one scheme here: a key of another curve or type is
refused rather than used in a form some verifier rejects.

Private keys: PEM PKCS#8 (``BEGIN PRIVATE KEY``) or SEC 1 (``BEGIN EC PRIVATE KEY``), optionally
encrypted with the password in ``CACHEBAKE_SIGN_PASSWORD``.  cosign's own ``ENCRYPTED SIGSTORE
PRIVATE KEY`` (scrypt + secretbox) is not read; ``cachebake keygen`` or
``openssl ecparam -name prime256v1 -genkey | openssl pkcs8 -topk8 -nocrypt`` make a key cosign
verifies with its ``.pub``.

A verifier's keys: ``--verify-key`` (a PEM file, or the PEM text itself: a Pod passes it as an
argument, public keys being no secret) or a policy file (``load_policy``)."""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from cachebake.errors import BadInput, Unsupported

PASSWORD_ENV = "CACHEBAKE_SIGN_PASSWORD"
PEM_PUBLIC = "-----BEGIN PUBLIC KEY-----"
MAX_PEM = 16 << 10  # a P-256 public key is ~180 bytes of PEM; a policy of many keys stays small
MAX_POLICY = 1 << 20


def _crypto():
    try:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError:
        raise Unsupported("signing and verifying need the Python package 'cryptography' "
                          "(a dependency of cachebake: pip install cryptography)") from None
    return ec, hashes, serialization, InvalidSignature


@dataclass(frozen=True)
class PublicKey:
    """A trusted key: its PEM (as given), a name for reports, and the key itself."""

    name: str
    pem: str
    key: object  # cryptography's EllipticCurvePublicKey

    @property
    def der(self) -> bytes:
        _, _, serialization, _ = _crypto()
        return self.key.public_bytes(serialization.Encoding.DER,
                                     serialization.PublicFormat.SubjectPublicKeyInfo)

    @property
    def fingerprint(self) -> str:
        """``sha256:<hex>`` of the DER SubjectPublicKeyInfo: what install.json records."""
        return "sha256:" + hashlib.sha256(self.der).hexdigest()

    @property
    def hint(self) -> str:
        """The Sigstore bundle's ``publicKey.hint``: base64 of SHA-256 over the DER key, the
        RFC 6962 key id that protobuf-specs recommends and cosign writes."""
        return base64.b64encode(hashlib.sha256(self.der).digest()).decode()

    def verifies(self, signature_b64: str, data: bytes) -> bool:
        """Whether ``signature_b64`` (base64 of an ASN.1 DER ECDSA signature) signs ``data``
        with SHA-256 under this key.  Any malformed signature is simply not a valid one."""
        ec, hashes, _, invalid = _crypto()
        try:
            sig = base64.b64decode(signature_b64, validate=True)
            self.key.verify(sig, data, ec.ECDSA(hashes.SHA256()))
            return True
        except (invalid, ValueError, TypeError):
            return False


def _check_curve(key, where: str) -> None:
    ec, _, _, _ = _crypto()
    if not isinstance(key, (ec.EllipticCurvePublicKey, ec.EllipticCurvePrivateKey)) \
            or not isinstance(key.curve, ec.SECP256R1):
        raise BadInput(f"{where}: not an ECDSA P-256 key (the scheme cosign, Kyverno and "
                       "policy-controller all verify)")


def _read_text(path: str, cap: int, what: str) -> bytes:
    """A key or policy file the user named: links followed (a Kubernetes Secret's file is a
    link into ``..data/``), then a regular file only, opened without blocking: a FIFO or a
    device named as a key is refused at once instead of waiting forever (attack corpus, issue
    31: ``--verify-key FIFO`` hung)."""
    from cachebake.errors import CachebakeError
    from cachebake.fsops import read_at_most
    from cachebake.jsonio import open_regular

    try:
        fd = open_regular(os.path.realpath(path), what, missing=BadInput)
    except CachebakeError as e:  # the user's file, not an artifact's: bad input
        raise BadInput(f"{path}: {what}: {e.line()}") from None
    try:
        data = read_at_most(fd, cap + 1)
    except OSError as e:
        raise BadInput(f"{path}: {what}: {e.strerror}") from None
    finally:
        os.close(fd)
    if len(data) > cap:
        raise BadInput(f"{path}: {what}: over {cap} bytes")
    return data


def parse_public_key(pem: bytes | str, name: str) -> PublicKey:
    _, _, serialization, _ = _crypto()
    data = pem.encode() if isinstance(pem, str) else pem
    if len(data) > MAX_PEM:
        raise BadInput(f"{name}: a public key over {MAX_PEM} bytes")
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError):
        raise BadInput(f"{name}: not a PEM public key (-----BEGIN PUBLIC KEY-----)") from None
    _check_curve(key, name)
    return PublicKey(name, data.decode("ascii", "replace"), key)


def load_public_key(value: str) -> PublicKey:
    """``value``: a PEM file, or the PEM text itself (what a Pod's arguments carry)."""
    if value.lstrip().startswith(PEM_PUBLIC):
        return parse_public_key(value, "--verify-key (PEM text)")
    return parse_public_key(_read_text(value, MAX_PEM, "public key"), value)


def load_private_key(path: str):
    """The signing key at ``path`` (PEM, P-256), decrypted with $CACHEBAKE_SIGN_PASSWORD if set."""
    _, _, serialization, _ = _crypto()
    data = _read_text(path, MAX_PEM, "signing key")
    password = os.environ.get(PASSWORD_ENV)
    try:
        key = serialization.load_pem_private_key(data, password.encode() if password else None)
    except TypeError:
        raise BadInput(f"{path}: the signing key is encrypted: set {PASSWORD_ENV}" if not password
                       else f"{path}: the signing key is not encrypted: unset {PASSWORD_ENV}") from None
    except ValueError:
        raise BadInput(f"{path}: not a PEM private key this reads (PKCS#8 or SEC 1, ECDSA P-256; "
                       f"a wrong {PASSWORD_ENV} reads the same); cosign's own encrypted key format "
                       "is not read") from None
    _check_curve(key, path)
    return key


def public_of(private_key, name: str = "signing key") -> PublicKey:
    _, _, serialization, _ = _crypto()
    pem = private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                serialization.PublicFormat.SubjectPublicKeyInfo)
    return parse_public_key(pem, name)


def sign_bytes(private_key, data: bytes) -> str:
    """base64 of the ASN.1 DER ECDSA-P256-SHA256 signature over ``data`` (cosign's form)."""
    ec, hashes, _, _ = _crypto()
    return base64.b64encode(private_key.sign(data, ec.ECDSA(hashes.SHA256()))).decode()


def generate(prefix: str) -> tuple[Path, Path]:
    """A new P-256 key pair: PREFIX.key (PKCS#8 PEM, mode 0600, never over an existing file)
    and PREFIX.pub (the PEM public key cosign, Kyverno and policy-controller take)."""
    ec, _, serialization, _ = _crypto()
    key = ec.generate_private_key(ec.SECP256R1())
    password = os.environ.get(PASSWORD_ENV)
    encryption = serialization.BestAvailableEncryption(password.encode()) if password \
        else serialization.NoEncryption()
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption)
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    key_path, pub_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    for path in (key_path, pub_path):
        if os.path.lexists(path):
            raise BadInput(f"{path}: already exists (keygen never overwrites a key)")
    try:
        fd = os.open(key_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(private)
        fd = os.open(pub_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(public)
    except OSError as e:
        raise BadInput(f"{e.filename or prefix}: cannot write the key pair: {e.strerror}") from None
    return key_path, pub_path


# --------------------------------------------------------------------------------- policy


def load_policy(path: str) -> list[PublicKey]:
    """A policy file: JSON ``{"keys": [{"name": "ci", "pem": "-----BEGIN PUBLIC KEY-----..."}]}``.
    A bake is accepted when a signature of any listed key verifies (as Kyverno's ``count``
    unset and a policy-controller authority list: any one authority)."""
    from cachebake.errors import CorruptArtifact
    from cachebake.jsonio import parse_json

    try:
        doc = parse_json(_read_text(path, MAX_POLICY, "signature policy"), f"{path}: signature policy")
    except CorruptArtifact as e:  # the user's file, not an artifact: bad input
        raise BadInput(str(e)) from None
    if not isinstance(doc, dict) or set(doc) - {"keys"} or not isinstance(doc.get("keys"), list) \
            or not doc["keys"]:
        raise BadInput(f"{path}: a signature policy is {{\"keys\": [{{\"name\": ..., \"pem\": ...}}, ...]}} "
                       "with at least one key, and nothing else")
    keys = []
    for i, entry in enumerate(doc["keys"]):
        if not isinstance(entry, dict) or set(entry) - {"name", "pem"} \
                or not isinstance(entry.get("pem"), str) or not isinstance(entry.get("name", ""), str):
            raise BadInput(f"{path}: keys[{i}]: must be {{\"name\": STRING, \"pem\": PEM}}")
        name = entry.get("name") or f"keys[{i}]"
        keys.append(parse_public_key(entry["pem"], f"{path}: {name[:80]}"))
    return keys
