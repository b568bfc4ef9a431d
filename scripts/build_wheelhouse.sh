#!/usr/bin/env bash
# Build an offline wheelhouse on a connected machine, for the appliance host's Python version and platform:
# the appliance's own wheel, every dependency as a binary wheel, and Debian's bubblewrap package.
#
#   scripts/build_wheelhouse.sh OUT_DIR [--python 3.12] [--platform manylinux_2_28_x86_64] [--without "torch triton numpy"]
#
# --without leaves out packages the host already has (a GPU server keeps its own CUDA build of torch and triton).
# Install on the host, with no network:  python3 -m pip install --no-index --find-links OUT_DIR kernel-optimizer-appliance
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: build_wheelhouse.sh OUT_DIR [--python X.Y] [--platform TAG] [--without "pkg ..."]}
shift
python_version=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
platform=manylinux_2_28_x86_64
without=""
while [ $# -gt 0 ]; do
  case $1 in
    --python) python_version=$2; shift 2 ;;
    --platform) platform=$2; shift 2 ;;
    --without) without=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"

# 1. The appliance itself.
python3 -m pip wheel --quiet --no-deps --wheel-dir "$out" "$repo"

# 2. Its dependencies from pyproject.toml, minus --without, resolved for the target interpreter.
mapfile -t reqs < <(python3 - "$repo/pyproject.toml" "$without" <<'PY'
import re, sys, tomllib
deps = tomllib.load(open(sys.argv[1], "rb"))["project"]["dependencies"]
skip = set(sys.argv[2].split())
for d in deps:
    if re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0].lower() not in skip:
        print(d)
PY
)
platforms=()
for n in 17 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
[ "$platform" != manylinux_2_28_x86_64 ] && platforms=(--platform "$platform")
python3 -m pip download --quiet --only-binary=:all: --python-version "$python_version" --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 --dest "$out" "${reqs[@]}"

# 3. The jail's tool, for hosts that lack it (unpack with dpkg -x, or install with dpkg -i).
if command -v apt-get >/dev/null; then
  (cd "$out" && apt-get download bubblewrap >/dev/null 2>&1) || echo "warning: could not download bubblewrap .deb" >&2
fi
ls "$out"
