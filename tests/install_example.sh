#!/usr/bin/env bash
# Install the build tree into a staging prefix, then build examples/ against
# the installed package twice: with CMake's find_package and with pkg-config.
# Usage: install_example.sh BUILD_DIR EXAMPLES_DIR CC
set -euo pipefail
build=$1 examples=$2 cc=$3
stage=$build/stage
rm -rf "$stage" "$build/example-cmake" "$build/example-pc"
cmake --install "$build" --prefix "$stage" >/dev/null
test -f "$stage/include/terse.h" && test -f "$stage/include/terse_plugin.h"
libdir=$(dirname "$(find "$stage" -name 'libterse.so.0' | head -n1)")
test -n "$libdir"
# Only terse_* may be exported from the shared library.
bad=$(nm -D --defined-only "$libdir/libterse.so.0" | awk '$2 != "A" {print $3}' | grep -v '^terse_' || true)
if [ -n "$bad" ]; then echo "non-terse symbols exported: $bad"; exit 1; fi
objdump -p "$libdir/libterse.so.0" | grep -q 'SONAME *libterse.so.0'
cmake -S "$examples" -B "$build/example-cmake" -DCMAKE_PREFIX_PATH="$stage" -DCMAKE_C_COMPILER="$cc" >/dev/null
cmake --build "$build/example-cmake" >/dev/null
LD_LIBRARY_PATH="$libdir" "$build/example-cmake/compress_vector" none 1000
mkdir -p "$build/example-pc"
PKG_CONFIG_PATH="$libdir/pkgconfig" \
  "$cc" -o "$build/example-pc/compress_vector" "$examples/compress_vector.c" \
  $(PKG_CONFIG_PATH="$libdir/pkgconfig" pkg-config --define-prefix --cflags --libs terse) -lm
LD_LIBRARY_PATH="$libdir" "$build/example-pc/compress_vector" none 1000
echo "install_and_build_example: ok"
