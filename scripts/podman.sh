# Sourced by the scripts that drive podman (build_images.sh, tests/images): podman reads the project's settings
# (images/containers.conf) and no other containers.conf, so the host's own is neither needed nor changed.
CONTAINERS_CONF="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/images/containers.conf"
export CONTAINERS_CONF
command -v podman > /dev/null || { echo "podman is not installed (make podman installs it)" >&2; exit 2; }
