# Shared by scripts/test and scripts/demo: installs the Debian packages that are missing.
# ensure_packages PKG...: installs only those not installed (apt-get as root, sudo otherwise).
ensure_packages() {
  local missing=() pkg
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "sluice: installing missing packages: ${missing[*]}"
  local sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then
      sudo=(sudo)
    else
      echo "sluice: need these Debian packages and cannot install them (not root, no sudo):" >&2
      echo "  apt-get install ${missing[*]}" >&2
      return 1
    fi
  fi
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Everything the build, the tests, the benchmarks and the demo use.
SLUICE_PACKAGES=(cmake ninja-build g++ clang libclang-rt-14-dev git curl
  libabsl-dev libxxhash-dev catch2 libbenchmark-dev
  libhiredis-dev redis-server redis-tools libyaml-cpp-dev libcpp-httplib-dev libpq-dev postgresql prometheus
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev)
