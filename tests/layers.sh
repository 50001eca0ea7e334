#!/usr/bin/env bash
# ctest layers: the library's folders stand in layers, and every use points
# down (DESIGN.md, "Layers"). Two checks, both on the real tree:
#   1. includes: no file includes a header of a layer above its own, and
#      bench/, examples/ and python/ include only the public headers;
#   2. symbols: no object file of the library needs a terse__ symbol that
#      only an object of a layer above its own defines (nm on the objects
#      this build made), so a call back up -- a circle -- fails here even
#      when it hides behind a declaration in a lower header.
# Layers, bottom to top (a layer may use any layer below it; the two on
# one line are siblings and may not use each other):
#   common
#   compress | transport
#   algos/comm      the communicator's services
#   algos/coll      the collectives
#   algos/engine    requests, progress, the public entry points
#   algos/ps        the parameter server (EXT requests on the engine)
#
#   layers.sh SOURCE_DIR OBJECT_DIR   (OBJECT_DIR: .../CMakeFiles/terse_obj.dir)
set -u
src=${1:?usage: layers.sh SOURCE_DIR OBJECT_DIR}
obj=${2:?usage: layers.sh SOURCE_DIR OBJECT_DIR}
cd "$src" || exit 1
fail=0
bad() { echo "FAIL: $*"; fail=1; }

# level PATH: the layer's rank (siblings share one) and its name, into LV
# and LN (no subshell: this runs for every include and every symbol).
level() {
    case $1 in
        common/*) LV=0 LN=common ;;
        compress/*) LV=1 LN=compress ;;
        transport/*) LV=1 LN=transport ;;
        algos/comm/*) LV=2 LN=algos/comm ;;
        algos/coll/*) LV=3 LN=algos/coll ;;
        algos/engine/*) LV=4 LN=algos/engine ;;
        algos/ps/*) LV=5 LN=algos/ps ;;
        *) LV=- LN=other ;;
    esac
}

# may_use FROM_PATH TO_PATH: 0 if a file at FROM may use one at TO.
may_use() {
    local la na lb nb
    level "$1"
    la=$LV na=$LN
    level "$2"
    lb=$LV nb=$LN
    [[ $la == - || $lb == - ]] && return 0
    [[ $na == "$nb" ]] && return 0
    ((lb < la))
}

# 1. includes
nfiles=0
while IFS= read -r f; do
    nfiles=$((nfiles + 1))
    while IFS= read -r inc; do
        [[ -e $inc ]] || continue
        may_use "$f" "$inc" || bad "$f includes $inc, a layer above or beside its own"
    done < <(sed -n 's/^#include "\([^"]*\)".*/\1/p' "$f")
done < <(find common compress transport algos -name '*.[ch]' | sort)
((nfiles > 60)) || bad "only $nfiles library files found under $src"
while IFS= read -r f; do
    if grep -qE '^#include "(common|compress|transport|algos)/' "$f"; then
        bad "$f includes an internal header; bench/ and examples/ use include/terse.h only"
    fi
done < <(find bench examples -name '*.[ch]' | sort)

# 2. symbols: where each terse__ symbol is defined, then who needs it.
defs=$(mktemp)
nobj=0
while IFS= read -r o; do
    nobj=$((nobj + 1))
    rel=${o#"$obj"/}
    rel=${rel%.o}
    nm --defined-only "$o" 2>/dev/null | awk -v f="$rel" '$2 ~ /^[TDBR]$/ && $3 ~ /^terse__/ { print $3, f }'
done < <(find "$obj" -name '*.c.o' | sort) >"$defs"
((nobj > 60)) || bad "only $nobj objects found under $obj (build first)"
uses=$(mktemp)
trap 'rm -f "$defs" "$uses"' EXIT
while IFS= read -r o; do
    rel=${o#"$obj"/}
    rel=${rel%.o}
    nm -u "$o" 2>/dev/null | awk -v f="$rel" '$2 ~ /^terse__/ { print $2, f }'
done < <(find "$obj" -name '*.c.o' | sort) >"$uses"
# user, symbol, definer for every use whose definer is in another folder
while read -r user sym where; do
    may_use "$user" "$where" || bad "$user calls $sym, defined in $where (a layer above or beside)"
done < <(awk 'NR == FNR { def[$1] = $2; next }
              ($1 in def) { w = def[$1]; u = $2; sub(/\/[^\/]*$/, "", w); d = u; sub(/\/[^\/]*$/, "", d)
                            if (w != d) print u, $1, def[$1] }' "$defs" "$uses")

[[ $fail == 0 ]] && echo "layers: $nfiles files' includes and $nobj objects' symbols point down"
exit $fail
