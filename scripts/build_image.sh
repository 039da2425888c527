#!/usr/bin/env bash
# Build deploy/Containerfile into an image, then print its size and the build's time.
#
#   scripts/build_image.sh [TAG]            # TAG: bastion:0.1.0
#
# With no settings this is the plain `docker build` of docs/deploy.md. A machine that
# reaches neither Docker Hub nor PyTorch's index (only PyPI and Debian's mirror) passes:
#   LOCAL_BASE=1        build BASE_IMAGE here first: Debian bookworm from Debian's mirror
#                       (debootstrap, as root) with its Python 3.11 and venv, `docker import`ed;
#                       it trusts the host's extra CA certificates (a TLS-inspecting egress)
#   BASE_IMAGE          the image to build FROM (python:3.11-slim-bookworm; with
#                       LOCAL_BASE=1, bastion-base:bookworm)
#   PIP_EXTRA_INDEX_URL the build's extra index (the Containerfile's: PyTorch's CPU builds);
#                       set it empty to use PyPI alone
#   WHEELS_DIR          a folder of wheels (a CPU build of torch) served to the build over
#                       HTTP on 127.0.0.1 as PIP_FIND_LINKS; the build then uses the host's
#                       network
#   DOCKER_NETWORK      the build's network (docker's default; `host` with WHEELS_DIR)
#
# This machine (no Docker Hub, no download.pytorch.org, torch's CPU wheel in /opt/wheels):
#   LOCAL_BASE=1 PIP_EXTRA_INDEX_URL= WHEELS_DIR=/opt/wheels scripts/build_image.sh
# tests/deploy/test_image.py then runs the image (`pytest -m slow tests/deploy/test_image.py`).
set -euo pipefail

TAG=${1:-bastion:0.1.0}
REPO_ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOCAL_BASE=${LOCAL_BASE:-0}
if [[ $LOCAL_BASE == 1 ]]; then
    BASE_IMAGE=${BASE_IMAGE:-bastion-base:bookworm}
fi
BASE_IMAGE=${BASE_IMAGE:-python:3.11-slim-bookworm}
DEBIAN_MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

build_args=(--build-arg "BASE_IMAGE=$BASE_IMAGE")
if [[ -v PIP_EXTRA_INDEX_URL ]]; then
    build_args+=(--build-arg "PIP_EXTRA_INDEX_URL=$PIP_EXTRA_INDEX_URL")
fi
network=${DOCKER_NETWORK:-}

docker info >/dev/null 2>&1 || { echo "no Docker daemon answers (docker info)" >&2; exit 2; }
# The legacy builder where the client has no buildx (Debian's docker.io): BuildKit is the
# client's default and refuses to run without it.
docker buildx version >/dev/null 2>&1 || export DOCKER_BUILDKIT=0

scratch=$(mktemp -d)
server_pid=
cleanup() {
    [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null
    rm -rf "$scratch"
}
trap cleanup EXIT

# A python:3.11-slim-bookworm stand-in: Debian's python3 is 3.11 on bookworm, and
# python-is-python3 gives the image's `python` as well.
make_local_base() {
    local rootfs=$scratch/rootfs
    echo "== debootstrap bookworm into $rootfs for $BASE_IMAGE"
    debootstrap --variant=minbase \
        --include=python3,python3-venv,python-is-python3,ca-certificates \
        bookworm "$rootfs" "$DEBIAN_MIRROR" >"$scratch/debootstrap.log" 2>&1 \
        || { tail -20 "$scratch/debootstrap.log" >&2; exit 1; }
    if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
        cp /usr/local/share/ca-certificates/*.crt "$rootfs/usr/local/share/ca-certificates/"
        chroot "$rootfs" update-ca-certificates >/dev/null
    fi
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/*
    # PIP_CERT: the venv's first pip (Debian's 23.0.1) reads certifi's bundle, not the
    # system one that holds the host's certificates.
    tar -C "$rootfs" --numeric-owner -c . | docker import \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
        --change 'CMD ["python3"]' \
        - "$BASE_IMAGE" >/dev/null
}

if [[ $LOCAL_BASE == 1 ]]; then
    if docker image inspect "$BASE_IMAGE" >/dev/null 2>&1; then
        echo "== $BASE_IMAGE is here already"
    else
        make_local_base
    fi
fi

if [[ -n ${WHEELS_DIR:-} ]]; then
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    python3 -m http.server --bind 127.0.0.1 --directory "$WHEELS_DIR" "$port" >"$scratch/http.log" 2>&1 &
    server_pid=$!
    build_args+=(--build-arg "PIP_FIND_LINKS=http://127.0.0.1:$port/")
    network=${network:-host}
fi
if [[ -n $network ]]; then
    build_args+=(--network "$network")
fi

echo "== docker build -t $TAG from $BASE_IMAGE"
started=$(date +%s)
docker build -f "$REPO_ROOT/deploy/Containerfile" -t "$TAG" "${build_args[@]}" "$REPO_ROOT"
finished=$(date +%s)
size=$(docker image inspect --format '{{.Size}}' "$TAG")
echo "== $TAG: $((size / 1000000)) MB, built in $((finished - started)) s"
