#!/usr/bin/env bash
# Builds .whl-ray/ (or DIR): Ray for Python 3.12 on x86-64 Linux, small enough to carry to the lent GPU machine
# beside the wheelhouse (64 MiB in all). Ray's wheel is ~80 MB; unzipped without the parts the appliance never loads
# (Java jars, rllib, data, tune, train, serve, llm) and packed with xz it is ~30 MB. Needs the network (PyPI).
#   scripts/build_ray_carry.sh [DIR] [RAY_VERSION]      then, on the GPU host: source scripts/gpu_ray_env.sh
set -euo pipefail
out=${1:-.whl-ray}
version=${2:-2.60.0}
pip_download() {
  python3 -m pip download -q --only-binary=:all: --python-version 3.12 --platform manylinux2014_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 "$@"
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pip_download --no-deps -d "$work" "ray==$version"
mkdir -p "$work/x" "$out/deps"
unzip -q "$work"/ray-*.whl -d "$work/x"
rm -rf "$work"/x/ray/{jars,rllib,data,tune,train,serve,llm}
tar cJf "$out/ray-trim.tar.xz" -C "$work/x" .
# Ray's own requirements (its METADATA without extras), as wheels
pip_download -d "$out/deps" click filelock jsonschema "msgpack<2" packaging "protobuf>=3.20.3" pyyaml requests
du -sh "$out"
