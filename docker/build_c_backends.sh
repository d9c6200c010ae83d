#!/usr/bin/env bash
# Compile every C backend in SRC (c_backends/) into BACKENDS/<name>/libtriton_<name>.so, linked
# against LIBTRITONSERVER. Used by docker/triton.Dockerfile so that the NGC image gets the C
# backends built against *its* libtritonserver.so and glibc, not the host's.
#
# Layout (as lab_backends/server/cbackend.py): SRC/include/ (shared headers, entry points marked
# LAB_EXPORT) and SRC/<name>/<name>.c per backend; the flags match cbackend.CFLAGS.
# -Wl,-z,defs makes a misspelled TRITONBACKEND_* name fail here, not at model load.
set -euo pipefail
SRC=${1:?usage: build_c_backends.sh SRC_DIR BACKEND_DIR LIBTRITONSERVER}
BACKENDS=${2:?backend dir}
LIB=${3:?path of libtritonserver.so}
built=0
build() {  # name, sources...
  local name=$1; shift
  mkdir -p "$BACKENDS/$name"
  gcc -std=gnu11 -O2 -Wall -Wextra -Werror -fPIC -fvisibility=hidden -shared -I "$SRC/include" "$@" \
      -o "$BACKENDS/$name/libtriton_$name.so" -Wl,-z,defs "$LIB" -lm
  echo "built $BACKENDS/$name/libtriton_$name.so"
  built=$((built + 1))
}
shopt -s nullglob
for dir in "$SRC"/*/; do
  name=$(basename "$dir")
  [ "$name" = include ] && continue
  [ -f "$dir$name.c" ] && build "$name" "$dir$name.c"
done
echo "$built C backend(s) built"
