#!/usr/bin/env bash
# Downloads (here, with apt-get download) the Debian packages our build needs, into the
# git-ignored folder .deb/ of the repository, and packs what the build reads into
# .deb/bundle/qs-deps.tar.xz. The GPU machine has no Debian -dev packages and no network: run
# this here, then name ".deb/bundle" in the device call's `carry`; tools/gpu/build_on_device.sh
# unpacks the bundle there into a private prefix.
#
#   tools/gpu/fetch_debs.sh        # idempotent; prints the folder's size
set -euo pipefail

repo=$(cd "$(dirname "$0")/../.." && pwd)
dest="$repo/.deb"
mkdir -p "$dest"

# -dev packages of CMakeLists.txt's find_package/pkg_check_modules, and the runtime libraries
# they link against (the GPU machine has none of them): OpenBLAS (+ gfortran runtime), fmt,
# PCRE2, nlohmann-json, CLI11, GoogleTest/GoogleMock, cpp-httplib, and pkgconf for
# pkg_check_modules.
packages=(
  libopenblas-dev libopenblas-pthread-dev libopenblas0-pthread libopenblas0
  libgfortran5 libquadmath0
  libfmt-dev libfmt9
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev googletest
  pkgconf pkgconf-bin libpkgconf3
  # app/server: cpp-httplib, the pkg-config modules it requires and their headers (httplib.h
  # includes OpenSSL's and Brotli's); their shared libraries are the machine's own
  # (build_on_device.sh links the -dev symlinks to them).
  libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libbrotli-dev zlib1g-dev
)
# When CMakeLists.txt gains a find_package/pkg_check_modules, add its -dev package here.

cd "$dest"
missing=()
for p in "${packages[@]}"; do
  compgen -G "${p}_*.deb" >/dev/null || missing+=("$p")
done
if ((${#missing[@]})); then
  # apt-get download writes into the current directory; as root it warns that the _apt user
  # cannot write here, which is harmless.
  apt-get download "${missing[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
fi
for p in "${packages[@]}"; do
  compgen -G "${p}_*.deb" >/dev/null || { echo "fetch_debs: failed to download $p" >&2; exit 1; }
done
echo "fetch_debs: $(ls "$dest"/*.deb | wc -l) packages, $(du -sh "$dest" | cut -f1) in $dest"

# --- the bundle that travels ---------------------------------------------------------------------
# A device call carries at most 64 MiB, the committed tree included (models, goldens), so the
# .debs themselves are too big to carry. Bundle only what the build reads: headers, shared
# libraries, CMake and pkg-config files (no static archives but GoogleTest's, no docs, no
# sources), xz-compressed, into .deb/bundle/ — the path to name in `carry`.
# OpenBLAS's shared library alone is 4 MB compressed; when the tree leaves no room for it,
# the bundle goes without, and build_on_device.sh builds tools/gpu/cblas_shim.c in its place.
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
for deb in "$dest"/*.deb; do dpkg -x "$deb" "$stage"; done
lib=$stage/usr/lib/x86_64-linux-gnu
rm -rf "$stage/usr/share/doc" "$stage/usr/share/man" "$stage/usr/share/lintian" \
  "$stage/usr/share/aclocal" "$stage/usr/src"
find "$stage" -name '*.a' ! -name 'libgtest*.a' ! -name 'libgmock*.a' -delete
rm -f "$lib"/openblas-pthread/liblapack.so* "$lib"/openblas-pthread/libblas.so*
mkdir -p "$dest/bundle"
rm -f "$dest"/bundle/qs-deps*.tar.xz
tree_bytes=$(cd "$repo" && { git ls-files -z; git ls-files -z --others --exclude-standard; } |
  xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')
limit=$((62 * 1024 * 1024))  # 64 MiB less a margin for files added later
tar -C "$stage" -cJf "$dest/bundle/qs-deps.tar.xz" usr
bundle_bytes=$(stat -c %s "$dest/bundle/qs-deps.tar.xz")
if ((tree_bytes + bundle_bytes > limit)); then
  rm -rf "$lib/openblas-pthread" "$lib"/libgfortran* "$lib"/libquadmath*
  tar -C "$stage" -cJf "$dest/bundle/qs-deps.tar.xz" usr
  bundle_bytes=$(stat -c %s "$dest/bundle/qs-deps.tar.xz")
  echo "fetch_debs: no room for OpenBLAS: the device build will use tools/gpu/cblas_shim.c"
fi
echo "fetch_debs: bundle $((bundle_bytes / 1024)) KiB + tree $((tree_bytes / 1024 / 1024)) MiB" \
  "(device calls carry at most 64 MiB); carry \".deb/bundle\""
((tree_bytes + bundle_bytes <= 64 * 1024 * 1024)) || { echo "fetch_debs: over 64 MiB" >&2; exit 1; }
