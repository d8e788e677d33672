#!/usr/bin/env bash
# Builds deploy/docker/Dockerfile (the CPU image) from the committed tree and
# runs it twice: the digits demo under `psrt-run --local=2`, and `train` as
# SageMaker runs a training image, on an /opt/ml laid out as SageMaker lays
# it out for one host. `make image-check` runs this; it needs root.
#
# No Docker daemon: buildah builds the Dockerfile unchanged (chroot
# isolation, the host's network). Where no debian:12 image can be pulled,
# one is made with mmdebstrap from Debian's mirror. Both come from Debian
# (apt-get install buildah mmdebstrap). Behind a proxy that re-signs TLS,
# PIP_CERT names the CA bundle the build's pip is to trust.
#
# Usage: scripts/image_check.sh [IMAGE]      (default IMAGE: localhost/psrt:check)
set -euo pipefail

image=${1:-localhost/psrt:check}
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { echo "image-check: $*"; }

if [ "$(id -u)" -ne 0 ]; then
  echo "image-check: needs root (buildah with chroot isolation)" >&2
  exit 2
fi
if ! command -v buildah >/dev/null || ! command -v mmdebstrap >/dev/null; then
  log "installing buildah and mmdebstrap"
  apt-get install -y -qq buildah mmdebstrap >/dev/null
fi

work=$(mktemp -d /tmp/psrt-image-check.XXXXXX)
container=
cleanup() {
  [ -n "$container" ] && buildah rm "$container" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT

if ! buildah inspect --type image docker.io/library/debian:12 >/dev/null 2>&1 &&
  ! buildah pull -q docker.io/library/debian:12 >/dev/null 2>&1; then
  log "no debian:12 to pull; making one with mmdebstrap"
  mmdebstrap --variant=minbase --quiet bookworm "$work/debian12.tar"
  base=$(buildah from scratch)
  buildah add "$base" "$work/debian12.tar" / >/dev/null
  buildah config --cmd bash "$base"
  buildah commit -q --rm "$base" docker.io/library/debian:12 >/dev/null
fi

# The committed tree, as a fresh clone has it.
mkdir "$work/src"
git -C "$root" archive --format=tar HEAD | tar -x -C "$work/src"
build_args=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then build_args+=(--build-arg "TORCH_INDEX_URL=$TORCH_INDEX_URL"); fi
volumes=()
if [ -n "${PIP_CERT:-}" ]; then
  mkdir -p "$work/pip"
  cp "$PIP_CERT" "$work/pip/ca.crt"
  printf '[global]\ncert = /run/psrt-pip/ca.crt\n' >"$work/pip/pip.conf"
  volumes+=(-v "$work/pip:/run/psrt-pip:ro" -v "$work/pip/pip.conf:/etc/pip.conf:ro")
fi
log "building $image from deploy/docker/Dockerfile"
start=$SECONDS
buildah bud --isolation chroot --pull=never --layers "${volumes[@]}" "${build_args[@]}" \
  -f "$work/src/deploy/docker/Dockerfile" -t "$image" "$work/src"
log "built $image in $((SECONDS - start)) s: $(buildah images --format '{{.Size}}' "$image")"

container=$(buildah from "$image")
run() { buildah run --isolation chroot --hostname algo-1 "$container" -- "$@"; }

log "the digits demo: psrt-run --local=2"
run psrt-run --local=2 -- python /opt/psrt/examples/torch_digits.py | tee "$work/demo.log"
grep -q "demo: test accuracy" "$work/demo.log"

log "train, as SageMaker runs the image (one host, algo-1, 2 training processes)"
mnt=$(buildah mount "$container")
ml=$mnt/opt/ml
mkdir -p "$ml/input/config" "$ml/model" "$ml/output/data" "$ml/code"
cp "$root/examples/sagemaker_digits.py" "$root/examples/torch_digits.py" "$ml/code/"
cat >"$ml/input/config/resourceconfig.json" <<'EOF'
{"current_host": "algo-1", "hosts": ["algo-1"], "current_group_name": "homogeneousCluster",
 "current_instance_type": "ml.c5.xlarge",
 "instance_groups": [{"instance_group_name": "homogeneousCluster", "instance_type": "ml.c5.xlarge",
                      "hosts": ["algo-1"]}]}
EOF
cat >"$ml/input/config/hyperparameters.json" <<'EOF'
{"sagemaker_program": "\"sagemaker_digits.py\"", "sagemaker_submit_directory": "\"/opt/ml/code\"",
 "sagemaker_parameter_server_enabled": "true", "sagemaker_region": "\"us-east-1\"",
 "psrt_distribution": "{\"workers_per_host\": 2}"}
EOF
echo '{}' >"$ml/input/config/inputdataconfig.json"
# SageMaker's hosts resolve their own names; buildah writes /etc/hosts per run.
run sh -c 'grep -qw algo-1 /etc/hosts || echo "127.0.0.1 algo-1" >>/etc/hosts; exec train'
test -s "$ml/model/model.pth" || { echo "image-check: no /opt/ml/model/model.pth" >&2; exit 1; }
test -e "$ml/output/success" || { echo "image-check: no /opt/ml/output/success" >&2; exit 1; }
log "ok: $image trains the demo, and as SageMaker's training image leaves model.pth and output/success"
