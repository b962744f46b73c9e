#!/bin/sh
# Installs libstasis under PREFIX: lib/libstasis.{so,a}, include/stasis.h,
# lib/pkgconfig/stasis.pc.   usage: install.sh PREFIX [LIBDIR]
# LIBDIR: where libstasis.so and libstasis.a already are (default: build
# them with `cargo build --release -p stasis-app` and take target/release).
set -eu
prefix=${1:?usage: install.sh PREFIX [LIBDIR]}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
libdir=${2:-}
if [ -z "$libdir" ]; then
    (cd "$root" && cargo build --release -p stasis-app)
    libdir=$root/target/release
fi
version=$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/Cargo.toml" | head -n1)
mkdir -p "$prefix/lib/pkgconfig" "$prefix/include"
cp "$libdir/libstasis.so" "$libdir/libstasis.a" "$prefix/lib/"
cp "$root/include/stasis.h" "$prefix/include/"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" "$here/stasis.pc.in" > "$prefix/lib/pkgconfig/stasis.pc"
echo "installed libstasis $version under $prefix (PKG_CONFIG_PATH=$prefix/lib/pkgconfig)"
