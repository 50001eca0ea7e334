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
# README's pkg-config line, as written there (-lm for the example's sqrt, the
# rpath for a prefix the loader does not search)
grep -qF 'cc examples/compress_vector.c -o compress_vector $(pkg-config --cflags --libs terse) -lm \' "$examples/../README.md" &&
  grep -qF '   -Wl,-rpath,$(pkg-config --variable=libdir terse)' "$examples/../README.md" ||
  { echo "README.md's pkg-config line changed: change it here too"; exit 1; }
export PKG_CONFIG_PATH="$libdir/pkgconfig"
"$cc" "$examples/compress_vector.c" -o "$build/example-pc/compress_vector" $(pkg-config --cflags --libs terse) -lm \
   -Wl,-rpath,$(pkg-config --variable=libdir terse)
# plain pkg-config (no --define-prefix) names the staging prefix, not the configured one
pkg-config --cflags terse | grep -q -- "-I$stage/" ||
  { echo "terse.pc does not follow its prefix"; exit 1; }
# installed programs start in a clean environment (RUNPATH $ORIGIN/../lib)
for prog in "$stage"/bin/*; do
  readelf -d "$prog" | grep -q 'RUNPATH.*\$ORIGIN' || { echo "$prog: no \$ORIGIN RUNPATH"; exit 1; }
done
env -i "$stage/bin/terse-run" --help >/dev/null
env -i "$build/example-pc/compress_vector" qsgd:bits=4 100000 >/dev/null
# The Python package, installed beside the library, loads that library.
if [ -x /usr/bin/python3 ] && /usr/bin/python3 -c "import numpy" 2>/dev/null; then
  pkg=$(dirname "$(find "$stage" -path '*dist-packages/terse/__init__.py' | head -n1)")
  test -n "$pkg"
  got=$(cd / && env -i PATH=/usr/bin:/bin PYTHONPATH="$(dirname "$pkg")" PYTHONDONTWRITEBYTECODE=1 \
        /usr/bin/python3 -c 'import terse, numpy as np
c = terse.Codec("int8", 100); assert len(c.decode(c.encode(np.ones(100, np.float32)))) == 100
print(terse.library_path, terse.library_found_in)')
  # the directory is the one /usr/bin/python3 reads under the default prefix
  want=$(/usr/bin/python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])')
  case "$pkg" in */lib/$want/dist-packages/terse) ;; *) echo "package at $pkg, not lib/$want/dist-packages"; exit 1 ;; esac
  case "$got" in
    "$libdir/libterse.so.0 beside the package") ;;
    *) echo "installed Python package loaded the wrong library: $got"; exit 1 ;;
  esac
fi
echo "install_and_build_example: ok"
