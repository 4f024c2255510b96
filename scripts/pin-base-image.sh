#!/usr/bin/env bash
# Pin the Dockerfile's base image by digest: resolves the tag on the FROM line to the digest the
# registry serves now and rewrites the line as `FROM image:tag@sha256:...`, so every later build
# gets exactly those bytes. Needs a Docker client that can reach the image's registry; run it
# again (and review the diff) when moving to a new Airflow release.
set -euo pipefail
cd "$(dirname "$0")/.."
line=$(grep -m1 -E '^FROM ' Dockerfile)
ref=${line#FROM }
image=${ref%%@*}
if ! command -v docker >/dev/null 2>&1; then
    echo "pin-base-image: no docker client here; run this where the registry of $image is reachable" >&2
    exit 2
fi
digest=$(docker buildx imagetools inspect "$image" --format '{{json .Manifest}}' 2>/dev/null \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["digest"])' 2>/dev/null || true)
if [ -z "$digest" ]; then
    docker pull -q "$image" >/dev/null
    digest=$(docker inspect --format '{{index .RepoDigests 0}}' "$image")
    digest=${digest#*@}
fi
case "$digest" in
    sha256:????????????????????????????????????????????????????????????????) ;;
    *) echo "pin-base-image: could not resolve a digest for $image (got '$digest')" >&2; exit 1 ;;
esac
sed -i -E "s|^FROM .*|FROM ${image}@${digest}|" Dockerfile
echo "Dockerfile: FROM ${image}@${digest}"
