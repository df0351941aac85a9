#!/usr/bin/env bash
# sigstore-js for tests/test_distribute_sign_verifiers.py: `npm ci` of tests/verifiers' lockfile
# (@sigstore/verify, @sigstore/bundle, exact versions and sha512s) into DEST/sigstore-js; prints
# its node_modules path, which the tests take from $CACHEBAKE_SIGSTORE_JS.
#
# node: the system's, else Debian's nodejs (bookworm: 18.20, ~6 s).  npm: the system's, else
# npm's own release tarball, pinned here by version and sha512 and checked before it is
# unpacked (it bundles its dependencies): Debian 12's npm package pulls 376 packages (~60 s).
#
#   bash .ci/sigstore-js.sh DEST
set -euo pipefail
export npm_config_update_notifier=false
dest=${1:?usage: sigstore-js.sh DEST}
NPM_VERSION=10.9.9  # engines: node ^18.17.0 || >=20.5.0
NPM_INTEGRITY=sha512-1g+6jLQvaIuB4zwvHL7yrXuXcWZwDsCtBX8bbWDqbvJSSr9nPiDDWTHNgwXR27iIcTTW7v3A57hDW9RYv2W4Yg==
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$dest"
if ! command -v node >/dev/null; then
  apt-get install -y -qq --no-install-recommends nodejs >/dev/null
fi
# A network that intercepts TLS has its CA in the system bundle (update-ca-certificates); node
# reads its own list unless told.
if [ -z "${NODE_EXTRA_CA_CERTS:-}" ] && [ -f /etc/ssl/certs/ca-certificates.crt ]; then
  export NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt
fi
npm=(npm)
if ! command -v npm >/dev/null; then
  registry=${npm_config_registry:-https://registry.npmjs.org}
  # node fetches it (https, sha512): nothing else is needed before npm runs
  node - "${registry%/}/npm/-/npm-$NPM_VERSION.tgz" "$NPM_INTEGRITY" "$dest/npm.tgz" <<'JS'
const [url, integrity, out] = process.argv.slice(2);
require('https').get(url, { timeout: 120000 }, (res) => {
  if (res.statusCode !== 200) { console.error(`sigstore-js.sh: ${url}: HTTP ${res.statusCode}`); process.exit(1); }
  const chunks = [];
  res.on('data', (c) => chunks.push(c)).on('end', () => {
    const data = Buffer.concat(chunks);
    const got = 'sha512-' + require('crypto').createHash('sha512').update(data).digest('base64');
    if (got !== integrity) { console.error(`sigstore-js.sh: ${url}: ${got}, pinned ${integrity}`); process.exit(1); }
    require('fs').writeFileSync(out, data);
  });
}).on('error', (e) => { console.error(`sigstore-js.sh: ${url}: ${e.message}`); process.exit(1); });
JS
  rm -rf "$dest/npm-$NPM_VERSION" && mkdir -p "$dest/npm-$NPM_VERSION"
  tar -xzf "$dest/npm.tgz" -C "$dest/npm-$NPM_VERSION" --strip-components=1 --no-same-owner
  npm=(node "$dest/npm-$NPM_VERSION/bin/npm-cli.js")
fi
rm -rf "$dest/sigstore-js" && mkdir -p "$dest/sigstore-js"
cp "$here/tests/verifiers/package.json" "$here/tests/verifiers/package-lock.json" "$dest/sigstore-js/"
(cd "$dest/sigstore-js" && "${npm[@]}" ci --ignore-scripts --no-audit --no-fund --loglevel=error >&2)
echo "node $(node --version), npm $("${npm[@]}" --version): $(cd "$dest/sigstore-js" && "${npm[@]}" ls --all --parseable | wc -l) packages" >&2
echo "$dest/sigstore-js/node_modules"
