#!/usr/bin/env bash
# Installs the Debian packages the product needs, where this user can: Fashion-MNIST (a real
# labelled set for federated training), Chromium (browser tests, chart export) and
# poppler-utils (the report test turns the PDF into PNG pages with pdftoppm).
# Idempotent: nothing is installed twice. Prints what it could not do instead of failing.
set -u
want=(dataset-fashion-mnist chromium poppler-utils)
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
if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
  echo "note: apt-get could not install ${missing[*]}; the features that use them say so when they run." >&2
fi
exit 0
