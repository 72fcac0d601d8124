#!/usr/bin/env bash
# A smoke test of the image's runtime stage, by hand (not in ctest: it needs Debian's archive,
# which tests may not reach). Builds the second stage of the Containerfile on a Debian base made
# by mmdebstrap from this machine's apt mirror, with the .deb of `make package` instead of the
# build stage, runs it under podman with the documented privileges, and creates a session and
# runs a command in an isolated box through it. Cleans up after itself.
#   deploy/container/smoke.sh [BUILD_DIR]        (root; podman, mmdebstrap, runc installed)
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:-$repo/build}" && pwd)
tmp=$(mktemp -d /tmp/agentbox-smoke.XXXXXX)
name=agentbox-smoke-$$
token=smoke-$RANDOM$RANDOM
port=19290
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  podman volume rm -f "$name" >/dev/null 2>&1 || true
  podman rmi -f "localhost/$name:latest" "localhost/$name-base:latest" >/dev/null 2>&1 || true
  rm -rf "$tmp"
}
trap cleanup EXIT

mirror=$(awk '/^URIs:/{print $2; exit}' /etc/apt/sources.list.d/debian.sources)
echo "== a bookworm base from $mirror"
mmdebstrap --quiet --variant=minbase --include=ca-certificates bookworm "$tmp/base.tar" "$mirror"
podman import -q "$tmp/base.tar" "localhost/$name-base:latest" >/dev/null

echo "== the runtime stage with the .deb of this build"
mkdir -p "$tmp/ctx/deploy/container"
cp "$repo/deploy/container/entrypoint" "$tmp/ctx/deploy/container/"
(cd "$build" && cpack -G DEB -B "$tmp/ctx/package" >/dev/null)
{
  echo "FROM localhost/$name-base:latest"
  sed -n '/^FROM \${DEBIAN}$/,$p' "$repo/deploy/container/Containerfile" | tail -n +2 |
    sed 's|^COPY --from=build /build/package/ /tmp/package/|COPY package/*.deb /tmp/package/|'
} >"$tmp/ctx/Containerfile"
# chroot isolation: crun refuses hybrid cgroup hosts for build steps.
podman build -q --format docker --isolation=chroot --network=host -t "localhost/$name:latest" "$tmp/ctx" >/dev/null

echo "== run it (--privileged --cgroupns=host, a volume for the data dir)"
# runc, not crun: crun refuses cgroup v1/hybrid hosts. Explicit ulimits: a host whose root lacks
# CAP_SYS_RESOURCE cannot raise them to podman's defaults.
podman --runtime runc --cgroup-manager cgroupfs run -d --name "$name" --privileged --no-healthcheck \
  --cgroupns=host --network=host --ulimit nofile=16384:16384 --ulimit nproc=16384:16384 \
  -v "$name:/var/lib/agentbox" -e AGENTBOX_TOKEN="$token" "localhost/$name:latest" \
  --config /etc/agentbox/agentboxd.yaml --listen "127.0.0.1:$port" >/dev/null
auth="Authorization: Bearer $token"
for _ in $(seq 100); do
  curl -sf -H "$auth" "http://127.0.0.1:$port/readyz" >/dev/null && break
  sleep 0.2
done
curl -sf -H "$auth" "http://127.0.0.1:$port/readyz" | grep -q '"backend":"ns"' ||
  { podman logs "$name"; echo "FAIL: /readyz"; exit 1; }
curl -sf -H "$auth" -X POST "http://127.0.0.1:$port/v1/sessions" -d '{"id":"smoke"}' >/dev/null
out=$(curl -sf -H "$auth" -X POST "http://127.0.0.1:$port/v1/sessions/smoke/exec" \
  -d '{"command":"echo hello from a box; hostname"}')
grep -q '"stdout":"hello from a box\\n' <<<"$out" || { echo "FAIL: exec: $out"; exit 1; }
podman exec "$name" agentbox doctor --no-daemon >/dev/null || { echo "FAIL: doctor in the image"; exit 1; }
podman stop -t 30 "$name" >/dev/null
echo "PASS: the image serves /readyz, makes a session and runs a command in its box"
