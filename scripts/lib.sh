# Shared helpers for lamina's scripts (sourced, not run).

# What building lamina needs beyond cargo: protoc and the protobuf well-known types, for
# the containerd snapshots API that lamina-snapshotter generates at build time.
BUILD_PACKAGES=(protobuf-compiler libprotobuf-dev pkg-config)

# Installs the Debian packages named that are not installed yet. apt-get update runs
# only when something is missing, so a prepared machine pays nothing.
ensure_apt_packages() {
  local missing=()
  for pkg in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$pkg")
    fi
  done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing ${missing[*]} from apt" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}
