#!/usr/bin/env bash
# Installs the Debian packages the product needs, where this user can: Fashion-MNIST (a real
# labelled set for federated training), Chromium (browser tests, chart export),
# poppler-utils (the report test turns the PDF into PNG pages with pdftoppm) and PostgreSQL
# (the store's tests start a throw-away server of their own from its binaries, see
# tests/postgres_server.py; no system-wide server is created or started for them) and
# bible-kjv (the King James Bible, public domain: the demo text of the text-model audit, read
# with its `bible` program; auditlib/data/demo_text.py).
# Idempotent: nothing is installed twice. Prints what it could not do instead of failing.
set -u
want=(dataset-fashion-mnist chromium poppler-utils postgresql bible-kjv)
missing=()
for p in "${want[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null 2>&1; then
  echo "note: cannot install ${missing[*]} (needs root and apt-get); the features that use them say so when they run." >&2
  exit 0
fi
echo "installing system packages: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/dev/null 2>&1 || true
# Debian's postgresql creates and starts a "main" cluster (listening on localhost:5432) on
# its first install; the tests need only the binaries, so that cluster is switched off for
# this install alone (postgresql-common reads createcluster.d; the file goes again after).
no_cluster=/etc/postgresql-common/createcluster.d/50-auditlib-no-main-cluster.conf
if [[ " ${missing[*]} " == *" postgresql "* ]] && [ ! -e "$no_cluster" ]; then
  mkdir -p "$(dirname "$no_cluster")" &&
    echo "create_main_cluster = false  # written by auditlib's install_system_deps.sh" >"$no_cluster" &&
    trap 'rm -f "$no_cluster"' EXIT
fi
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
  echo "note: apt-get could not install ${missing[*]}; the features that use them say so when they run." >&2
fi
exit 0
