#!/usr/bin/env bash
# The README's FetchContent recipe, as written: takes the fenced ```cmake block of README.md that
# declares sluice with FetchContent, replaces only its GIT_REPOSITORY with a bare clone of the
# repository this test runs from (tags included; FetchContent cannot download here), and builds
# a consumer that includes every header README.md names (sluice/<...>.hpp), then runs it. The
# consumer checks that the fetched sluice reports the version the pinned tag names. Fails with a
# message naming the fix when the tag does not exist (the maintainer tags the release on main),
# when the tag lacks a header the README names, or when the tag's version is not the tag's name.
# Headers of an optional part whose dependency is missing on this machine are skipped, each said.
# Usage: readme_recipe_test.sh <cmake> <source dir> <work dir>
# Exit 77 (skipped): no git, the source dir is not a git checkout, or it carries no tag at all
# (a clone made without tags cannot check a pin; one with tags but not this one fails).
set -euo pipefail

cmake=$1
source_dir=$(cd "$2" && pwd)
work=$3
readme="$source_dir/README.md"

fail() {
  echo "readme_recipe: FAIL: $*" >&2
  exit 1
}

command -v git >/dev/null || { echo "readme_recipe: skipped: no git"; exit 77; }
git -C "$source_dir" rev-parse --git-dir >/dev/null 2>&1 ||
  { echo "readme_recipe: skipped: $source_dir is not a git checkout"; exit 77; }

# --- the recipe: the one fenced cmake block with FetchContent_Declare(sluice ----------------------
recipe=$(awk '
  /^```cmake[[:space:]]*$/ { inside = 1; block = ""; next }
  /^```/ && inside { inside = 0; if (block ~ /FetchContent_Declare\(sluice/) { print block; found++ } next }
  inside { block = block $0 "\n" }
  END { if (found != 1) exit 1 }' "$readme") ||
  fail "README.md must have exactly one \`\`\`cmake block with FetchContent_Declare(sluice"
tag=$(sed -n 's/^[[:space:]]*GIT_TAG[[:space:]]\{1,\}\([^[:space:])]*\).*/\1/p' <<<"$recipe")
[ -n "$tag" ] || fail "the README's recipe has no GIT_TAG"
[ "$(grep -c '^[[:space:]]*GIT_REPOSITORY[[:space:]]' <<<"$recipe")" -eq 1 ] ||
  fail "the README's recipe must have one GIT_REPOSITORY line"

if [ -z "$(git -C "$source_dir" tag -l)" ]; then
  echo "readme_recipe: skipped: $source_dir carries no tags at all (a clone made with --no-tags);"
  echo "  fetch them (git fetch --tags) to check the README's pin $tag"
  exit 77
fi
if ! git -C "$source_dir" rev-parse -q --verify "refs/tags/$tag" >/dev/null; then
  fail "README.md pins GIT_TAG $tag, but $source_dir has no tag $tag. Tag the release commit on \
main (git tag -a $tag -m \"sluice ${tag#v}\" <commit>; docs/building.md, Releases and pinning), \
or fetch the tags of a shallow clone (git fetch --tags)"
fi
tag_version=$(git -C "$source_dir" show "$tag:CMakeLists.txt" |
  sed -n 's/^project(sluice VERSION \([0-9.]*\).*/\1/p')
[ "v$tag_version" == "$tag" ] ||
  fail "tag $tag holds project(sluice VERSION $tag_version): the tag must name its version"

# --- the headers the README names, each in the tag's tree ----------------------------------------
headers=$(grep -o 'sluice/[a-z0-9_/]*\.hpp' "$readme" | sort -u)
optional_parts="redis postgres yaml grpc httplib envoy"
includes=""
parts=""
for header in $headers; do
  git -C "$source_dir" cat-file -e "$tag:include/$header" 2>/dev/null ||
    fail "README.md names $header, which tag $tag does not have: pin a release that has it"
  part=${header#sluice/}
  part=${part%%/*}
  part=${part%.hpp}
  if [[ " $optional_parts " == *" $part "* ]]; then
    macro="SLUICE_README_HAS_$(tr '[:lower:]' '[:upper:]' <<<"$part")"
    includes+="#ifdef $macro"$'\n'"#include <$header>"$'\n'"#endif"$'\n'
    [[ " $parts " == *" $part "* ]] || parts+=" $part"
  else
    includes+="#include <$header>"$'\n'
  fi
done

# --- a consumer: the recipe as written, GIT_REPOSITORY pointing at a bare clone ------------------
rm -rf "$work"
mkdir -p "$work/consumer"
git clone -q --bare "$source_dir" "$work/sluice.git"
git -C "$work/sluice.git" rev-parse -q --verify "refs/tags/$tag" >/dev/null ||
  fail "the bare clone of $source_dir lacks tag $tag"
rewritten=$(sed "s|^\([[:space:]]*\)GIT_REPOSITORY[[:space:]].*|\1GIT_REPOSITORY \"file://$work/sluice.git\"|" \
  <<<"$recipe")
{
  echo 'cmake_minimum_required(VERSION 3.25)'
  echo 'project(readme_consumer LANGUAGES CXX)'
  echo 'add_executable(my_service main.cpp)'
  echo '# --- README.md, as written (GIT_REPOSITORY replaced) ---'
  echo "$rewritten"
  echo '# --- the optional parts whose headers README.md names ---'
  echo "foreach(part IN ITEMS$parts)"
  echo '  string(TOUPPER "${part}" upper)'
  echo '  if(TARGET sluice::${part})'
  echo '    target_link_libraries(my_service PRIVATE sluice::${part})'
  echo '    target_compile_definitions(my_service PRIVATE SLUICE_README_HAS_${upper})'
  echo '  else()'
  echo '    message(STATUS "readme_recipe: sluice::${part} is not built here (its dependency is missing): its headers are skipped")'
  echo '  endif()'
  echo 'endforeach()'
} >"$work/consumer/CMakeLists.txt"
cat >"$work/consumer/main.cpp" <<EOF
// Generated by tests/consumer/readme_recipe_test.sh: every header README.md names.
$includes#include <sluice/sluice.hpp>
#include <sluice/version.hpp>

#include <chrono>
#include <cstdio>
#include <string_view>

int main() {
  using namespace std::chrono_literals;
  auto limiter = sluice::GcraLimiter<>::create({{.requests = 2, .period = 1s}});
  if (!limiter.ok() || !limiter->check("k")->allowed()) return 2;
  if (std::string_view(sluice::kVersionString) != "${tag#v}") {
    std::printf("sluice reports version %s, the tag is $tag\n", sluice::kVersionString);
    return 1;
  }
  std::printf("readme_recipe: sluice %s\n", sluice::kVersionString);
  return 0;
}
EOF

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
"$cmake" -S "$work/consumer" -B "$work/build" "${generator[@]}" >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configuring the README's recipe failed"; }
grep 'readme_recipe:' "$work/configure.log" || true
"$cmake" --build "$work/build" -j2 >"$work/build.log" 2>&1 ||
  { cat "$work/build.log" >&2; fail "building the consumer of the README's recipe failed"; }
"$work/build/my_service" || fail "the consumer of the README's recipe exited $?"
echo "readme_recipe: $tag builds as README.md says, with $(wc -w <<<"$headers") headers"
