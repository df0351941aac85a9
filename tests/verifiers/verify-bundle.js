#!/usr/bin/env node
// Verify a Sigstore bundle (protobuf-specs Bundle, JSON) over an artifact's bytes with a plain
// public key, using sigstore-js's own verifier (@sigstore/bundle, @sigstore/verify; versions
// pinned by package-lock.json here).  No trusted root, no transparency log, no timestamp
// authority: the thresholds are 0, as `cosign verify --key --insecure-ignore-tlog` would be.
//
//   node verify-bundle.js BUNDLE.json ARTIFACT PUBKEY.pem [--by-hint]
//
// The key is trusted for whatever hint the bundle names (cosign --key ignores the hint too),
// or with --by-hint only under the hint cachebake writes (base64 sha256 of the DER key), as a
// verifier keeping a keyring by hint would.  Exit 0 and "verified" on stdout; exit 1 and the
// verifier's error on stderr (one line).  Nothing here decides validity: sigstore-js does.
'use strict';
const crypto = require('crypto');
const fs = require('fs');
const { bundleFromJSON } = require('@sigstore/bundle');
const { Verifier, toSignedEntity, toTrustMaterial } = require('@sigstore/verify');

const args = process.argv.slice(2);
const byHint = args.includes('--by-hint');
const [bundlePath, artifactPath, keyPath] = args.filter((a) => a !== '--by-hint');
if (!keyPath) {
  process.stderr.write('usage: verify-bundle.js BUNDLE.json ARTIFACT PUBKEY.pem [--by-hint]\n');
  process.exit(2);
}
try {
  const bundle = bundleFromJSON(JSON.parse(fs.readFileSync(bundlePath, 'utf8')));
  const artifact = fs.readFileSync(artifactPath);
  const der = crypto.createPublicKey(fs.readFileSync(keyPath, 'utf8')).export({ type: 'spki', format: 'der' });
  const key = { rawBytes: der, keyDetails: 'PKIX_ECDSA_P256_SHA_256' };
  const hint = crypto.createHash('sha256').update(der).digest('base64');
  const emptyRoot = { certificateAuthorities: [], timestampAuthorities: [], tlogs: [], ctlogs: [] };
  const anyHint = () => ({ publicKey: crypto.createPublicKey({ key: der, format: 'der', type: 'spki' }), validFor: () => true });
  const keys = byHint ? { [hint]: key } : anyHint;
  const trust = toTrustMaterial(emptyRoot, keys);
  const verifier = new Verifier(trust, { tlogThreshold: 0, ctlogThreshold: 0, tsaThreshold: 0, timestampThreshold: 0 });
  verifier.verify(toSignedEntity(bundle, artifact));
  process.stdout.write('verified\n');
} catch (e) {
  process.stderr.write(`${e.code ? e.code + ': ' : ''}${e.message}`.replace(/\s+/g, ' ') + '\n');
  process.exit(1);
}
