#!/usr/bin/env bash
# Build Horovod 0.28.1 (PyTorch binding, gloo) into a wheel cache outside the clone.
#
# Horovod 0.28.1's sdist sets CMAKE_CXX_STANDARD 14; torch 2.13's headers need C++17,
# so the two CMAKE_CXX_STANDARD lines are raised to 17 before building. The TensorFlow
# binding does not build against TF 2.21 and is left out (HOROVOD_WITHOUT_TENSORFLOW).
# On a CUDA build host, set HOROVOD_GPU_OPERATIONS=NCCL in the environment (images/gpu does).
# HOROVOD_SDIST_SHA256, when set, must match the downloaded sdist. Beside the wheel, WHEEL.built-with records the
# torch, Python and glibc it was built with.
#
# Usage: build_horovod_wheel.sh PYTHON WHEELHOUSE
set -euo pipefail
PY="$1"
WHEELHOUSE="$2"
VERSION="${HOROVOD_VERSION:-0.28.1}"
mkdir -p "$WHEELHOUSE"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$PY" -m pip download --quiet --no-deps --no-binary :all: "horovod==$VERSION" -d "$work"
if [ -n "${HOROVOD_SDIST_SHA256:-}" ]; then  # the images pin the sdist by hash
    echo "$HOROVOD_SDIST_SHA256  $work/horovod-$VERSION.tar.gz" | sha256sum -c - >&2
fi
tar -xzf "$work/horovod-$VERSION.tar.gz" -C "$work"
src="$work/horovod-$VERSION"
n=$(grep -rl --include=CMakeLists.txt 'CMAKE_CXX_STANDARD 14' "$src" | wc -l)
[ "$n" -ge 1 ] || { echo "build_horovod_wheel: no CMAKE_CXX_STANDARD 14 line found in $src" >&2; exit 1; }
grep -rl --include=CMakeLists.txt 'CMAKE_CXX_STANDARD 14' "$src" | xargs sed -i 's/CMAKE_CXX_STANDARD 14/CMAKE_CXX_STANDARD 17/g'
export HOROVOD_WITH_PYTORCH=1 HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_WITHOUT_MPI=1 HOROVOD_WITH_GLOO=1
export MAKEFLAGS="-j$(nproc)"
# torch must be importable by the build: build in the target environment, not in isolation.
"$PY" -m pip wheel --no-deps --no-build-isolation -w "$WHEELHOUSE" "$src"
# What the wheel was built against, in a file beside it: torch's C++ API is not stable across versions, so the wheel
# fits only the torch it was built with (build_images.sh reads this before it lends the wheel to an image's build).
wheel="$(ls -t "$WHEELHOUSE"/horovod-"$VERSION"-*.whl | head -n 1)"
"$PY" -c 'import platform, torch; print(f"torch=={torch.__version__}\npython=={platform.python_version()}\nglibc=={platform.libc_ver()[1]}")' \
    > "$wheel.built-with"
echo "$wheel"
