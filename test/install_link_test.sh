#!/bin/sh
# What a C host's build does: installs Headway (meson install --destdir into a temporary folder),
# compiles a C program with the installed headers and links it with what
# `pkg-config --cflags --libs headway` prints (the shared library) and what
# `pkg-config --static --cflags --libs headway` prints (libheadway.a), then runs both.
#
#   install_link_test.sh MESON BUILD_ROOT PREFIX PROGRAM.c CC [CC_FLAGS...]
set -eu
meson=$1 build=$2 prefix=$3 program=$4
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

"$meson" install -C "$build" --destdir "$tmp/root" --no-rebuild --quiet --skip-subprojects
root=$tmp/root$prefix
pc_file=$(find "$root" -name headway.pc)
[ -n "$pc_file" ] || { echo "headway.pc not installed under $root"; exit 1; }
# The .pc names the prefix it was configured for; the copy lies under the destdir.
pc() {
  PKG_CONFIG_PATH=$(dirname "$pc_file") pkg-config --define-variable=prefix="$root" "$@" headway
}
libdir=$(pc --variable=libdir)
linked=0

if [ -f "$libdir/libheadway.so" ]; then
  echo "== shared: $* $(pc --cflags --libs)"
  # shellcheck disable=SC2046
  "$@" -o "$tmp/host_shared" "$program" $(pc --cflags --libs) -lm
  LD_LIBRARY_PATH=$libdir "$tmp/host_shared"
  linked=$((linked + 1))
fi

if [ -f "$libdir/libheadway.a" ]; then
  # -lheadway would pick libheadway.so where both are installed: name the archive.
  flags=$(pc --static --cflags --libs | sed "s|-lheadway|$libdir/libheadway.a|")
  echo "== static: $* $flags"
  # shellcheck disable=SC2086
  "$@" -o "$tmp/host_static" "$program" $flags -lm
  if readelf -d "$tmp/host_static" | grep -q 'NEEDED.*libheadway'; then
    echo "host_static needs libheadway.so"
    exit 1
  fi
  "$tmp/host_static"
  linked=$((linked + 1))
fi

[ "$linked" -gt 0 ] || { echo "neither libheadway.so nor libheadway.a under $libdir"; exit 1; }
