# Shared by tools/run-tests and tools/run-benchmarks: install what is missing, configure, build.
# Not meant to be run on its own.

# Debian 12 packages every build needs.
HEADWAY_BUILD_PACKAGES=(g++ meson ninja-build pkg-config libhwy-dev libtbb-dev)

# Installs the Debian packages among "$@" that are not installed yet (as root, or through sudo).
install_missing() {
  local missing=()
  for pkg in "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "ok installed" ||
      missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "headway: installing ${missing[*]}"
  local sudo=()
  [ "$(id -u)" -ne 0 ] && sudo=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update -qq
  "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
}

# Configures (or reconfigures) build dir $1 with the remaining arguments as meson options.
configure() {
  local dir=$1
  shift
  if [ -f "$dir/build.ninja" ]; then
    meson configure "$dir" "$@"
  else
    meson setup "$dir" "$@"
  fi
}
