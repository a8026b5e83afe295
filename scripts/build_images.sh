#!/usr/bin/env bash
# Build trainpipe's images with podman (make images): images/Dockerfile once per kind, each image's build time and
# size printed. The base is the Dockerfile's digest-pinned python:3.11-slim-bookworm where a registry serves it;
# where none is reachable, a Debian bookworm base made here with debootstrap (Python 3.11 as `python`, the CI
# version), cached as a tarball under the user's cache folder so it is made once per machine and imported again
# in seconds. A rebuild with nothing changed takes its layers from podman's cache.
#
# What the build needs from this machine is mounted for the build only, never copied into a layer: the CA bundle
# pip trusts (a TLS-intercepting proxy's), where it lies on disk the folder of torch's CPU wheel, and for the cpu image
# the folder of the Horovod wheel this machine built against the same torch.
#
# Usage: build_images.sh REVISION KIND...   (the image references come from trainpipe.services.images, via PYTHON)
# Environment: PYTHON (the dev venv's), PYTHON_BASE (a base of your own), IMAGES_CACHE (the base's cache folder),
#   PIP_CERT (the CA bundle; default: the one pip is configured with here, if any), TORCH_WHEELS (a folder holding
#   torch's CPU wheel; default: pip's find-links here, if one holds it), HOROVOD_WHEELS (a folder holding Horovod's
#   wheel and its .built-with record; default: make horovod's, ~/.cache/trainpipe/wheels).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/podman.sh
. scripts/podman.sh
REVISION="$1"
shift
PY="${PYTHON:-.venv/bin/python}"
CACHE="${IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/trainpipe/images}"
PINNED_BASE="$(sed -n 's/^ARG PYTHON_BASE=//p' images/Dockerfile)"
LOCAL_BASE=localhost/trainpipe-base:bookworm
# what the local base holds beyond minbase: Python 3.11 as `python` with venv, and the CA store apt and pip use
BASE_PACKAGES=python3,python3-venv,python-is-python3,ca-certificates

# The Debian mirror apt uses on this machine (its sources, read now), for debootstrap and the base's own sources.
debian_sources() {
    apt-get indextargets --format '$(SITE) $(RELEASE)' 'Identifier: Packages' 2>/dev/null \
        | awk '$2 ~ /^bookworm(-updates|-security)?$/' | sort -u
}

local_base() {
    if podman image exists "$LOCAL_BASE"; then return; fi
    local tarball="$CACHE/debian-bookworm-${BASE_PACKAGES//,/-}.tar"
    if [ ! -s "$tarball" ]; then
        command -v debootstrap >/dev/null || { echo "build_images: debootstrap is missing (make podman)" >&2; exit 2; }
        local mirror rootfs start=$SECONDS
        mirror="$(debian_sources | awk '$2 == "bookworm" {print $1; exit}')"
        mirror="${mirror:-http://deb.debian.org/debian}"
        mkdir -p "$CACHE"
        rootfs="$(mktemp -d "$CACHE/rootfs.XXXXXX")"
        chmod 755 "$rootfs"  # the image's / (mktemp makes it 700: no other user could enter it)
        trap 'rm -rf "$rootfs"' EXIT
        echo "build_images: no registry base; debootstrap bookworm from $mirror into the cache (once per machine)"
        debootstrap --variant=minbase --include="$BASE_PACKAGES" bookworm "$rootfs" "$mirror" > "$CACHE/debootstrap.log"
        debian_sources | awk '{print "deb " $1 " " $2 " main"}' > "$rootfs/etc/apt/sources.list"
        [ -s "$rootfs/etc/apt/sources.list" ] || echo "deb $mirror bookworm main" > "$rootfs/etc/apt/sources.list"
        rm -rf "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/cache/apt/*.bin "$rootfs"/var/cache/apt/archives/*.deb \
            "$rootfs"/var/log/*.log "$rootfs"/var/log/apt/*
        tar --numeric-owner -C "$rootfs" -cf "$tarball.tmp" . && mv "$tarball.tmp" "$tarball"
        rm -rf "$rootfs"
        trap - EXIT
        echo "build_images: base made in $((SECONDS - start)) s ($(du -m "$tarball" | cut -f1) MB): $tarball"
    fi
    podman import --quiet --change 'CMD ["python"]' "$tarball" "$LOCAL_BASE" > /dev/null
}

# A digest of what an image's build reads: the files the Dockerfile copies (as .dockerignore leaves them), the
# Dockerfile, the revision, the build arguments and the base image's id.
inputs_digest() {
    {
        find pyproject.toml README.md src components pipelines dags images scripts/build_horovod_wheel.sh .dockerignore \
            -type f ! -path '*/__pycache__/*' ! -name '*.pyc' ! -path '*.egg-info/*' -print0 | sort -z | xargs -0 sha256sum
        echo "$REVISION" "$@" "$(podman image inspect --format '{{.Id}}' "$2")"
    } | sha256sum | cut -d' ' -f1
}

# The base: PYTHON_BASE if given; else the pinned one where a registry serves it; else the local one.
base="${PYTHON_BASE:-}"
if [ -z "$base" ]; then
    if podman image exists "$PINNED_BASE" || podman pull --quiet "$PINNED_BASE" > /dev/null 2>&1; then
        base="$PINNED_BASE"
    else
        local_base
        base="$LOCAL_BASE"
        echo "build_images: $PINNED_BASE is not reachable; building on $LOCAL_BASE (debootstrap, Debian bookworm)"
    fi
fi

# What the dependency stages borrow from this machine: mounted read-only for the build, never copied into a layer.
volumes=()
args=()
cert="${PIP_CERT:-$("$PY" -m pip config get global.cert 2>/dev/null || true)}"
if [ -n "$cert" ] && [ -f "$cert" ]; then
    volumes+=(--volume "$cert:/run/trainpipe-build/ca.pem:ro")
    args+=(--build-arg PIP_CERT=/run/trainpipe-build/ca.pem)
fi
# torch's CPU wheel from a folder pip here already finds it in (its find-links), if one holds it
for wheels in ${TORCH_WHEELS:-${PIP_FIND_LINKS:-$("$PY" -m pip config get global.find-links 2>/dev/null || true)}}; do
    if compgen -G "$wheels/torch-*+cpu-*.whl" > /dev/null; then
        volumes+=(--volume "$wheels:/run/trainpipe-build/wheels:ro")
        args+=(--build-arg TORCH_WHEELS=/run/trainpipe-build/wheels)
        break
    fi
done

# Horovod's wheel for the cpu image: the one this machine built (make horovod) where its .built-with record names the
# torch the cpu lock pins (torch's C++ API is not stable across versions), so the image does not compile the sdist
# again. The image checks the wheel's hash and that it loads against its own torch and glibc, and builds the sdist
# where it does not.
cpu_volumes=()
cpu_args=()
lock_torch="$(sed -n 's/^torch==\([^ ]*\) .*/\1/p' images/cpu/requirements.lock)"
hvd_wheels="${HOROVOD_WHEELS:-${XDG_CACHE_HOME:-$HOME/.cache}/trainpipe/wheels}"
hvd_wheel="$hvd_wheels/horovod-0.28.1-cp311-cp311-linux_x86_64.whl"
if [ -f "$hvd_wheel" ] && grep -qx "torch==$lock_torch" "$hvd_wheel.built-with" 2> /dev/null; then
    cpu_volumes+=(--volume "$hvd_wheels:/run/trainpipe-build/horovod:ro")
    cpu_args+=(--build-arg HOROVOD_WHEELS=/run/trainpipe-build/horovod
        --build-arg HOROVOD_WHEEL_SHA256="$(sha256sum "$hvd_wheel" | cut -d' ' -f1)")
elif [ -f "$hvd_wheel" ]; then
    echo "build_images: $hvd_wheel is not recorded as built with torch $lock_torch; the cpu image builds Horovod's sdist"
fi

for kind in "$@"; do
    if [ "$kind" = gpu ] && [ "$base" = "$LOCAL_BASE" ]; then
        echo "build_images: gpu skipped: it needs nvidia/cuda's devel image and torch's CUDA wheels from a registry"
        continue
    fi
    ref="$("$PY" -c "from trainpipe.services.images import reference; print(reference('$kind'))")"
    start=$SECONDS
    kind_args=("${args[@]}" --build-arg PYTHON_BASE="$base" --build-arg KIND="$kind")
    kind_volumes=("${volumes[@]}")
    if [ "$kind" = cpu ]; then
        kind_args+=("${cpu_args[@]}")
        kind_volumes+=("${cpu_volumes[@]}")
    fi
    # Nothing changed since the image was built (what the build reads, its arguments, the base): nothing to do.
    # podman's own cache would come to the same image, but only after hashing the 4 GB environment it copies.
    inputs="$(inputs_digest "$kind" "$base" "${kind_args[@]}")"
    if [ "$(podman image inspect --format '{{index .Labels "trainpipe.build-inputs"}}' "$ref" 2>/dev/null)" = "$inputs" ]
    then
        echo "build_images: $ref is up to date ($((SECONDS - start)) s)"
        continue
    fi
    # Two passes: the dependency stages (the only ones that need the network) with the mounts, then the image
    # without them, its dependency stages from the first pass's cache. A mount's target would otherwise be left
    # behind, empty, in the runtime stages' layers.
    if [ "${#kind_volumes[@]}" -gt 0 ]; then
        podman build --network host --layers -f images/Dockerfile --target deps "${kind_volumes[@]}" "${kind_args[@]}" .
    fi
    podman build --network host --layers -f images/Dockerfile "${kind_args[@]}" \
        --build-arg REVISION="$REVISION" --build-arg IMAGE_REF="$ref" --label trainpipe.build-inputs="$inputs" -t "$ref" .
    size="$(podman image inspect --format '{{.Size}}' "$ref")"
    echo "build_images: $ref built in $((SECONDS - start)) s, $((size / 1000000)) MB (base: $base)"
done
