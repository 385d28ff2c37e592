#!/bin/sh
# A compiler launcher for the header check: runs the compile command it is given with
# -fsyntax-only (parsing, name lookup, template checks and every front-end warning, but no code
# generation, about half the time of a full compile of one header) and then creates the object
# file the build expects, empty, since nothing links it.
out=
prev=
for arg in "$@"; do
  if [ "$prev" = "-o" ]; then out=$arg; fi
  prev=$arg
done
"$@" -fsyntax-only || exit $?
if [ -n "$out" ]; then : >"$out"; fi
