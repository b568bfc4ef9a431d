#!/usr/bin/env bash
# Build an offline wheelhouse on a connected machine, for the appliance host's Python version and platform:
# the appliance's own wheel, every dependency as a binary wheel, and Debian's bubblewrap package.
#
#   scripts/build_wheelhouse.sh OUT_DIR [--python 3.12] [--platform manylinux_2_28_x86_64] [--without "torch triton numpy"]
#                                       [--extras "gpu"] [--with "torch==2.13.0 ..."]
#
# --python     the host's Python X.Y (default: this machine's python3)
# --platform   one platform tag (default: manylinux 2.17 ... 2.34 on x86_64)
# --without    leaves out direct dependencies the host already has (a GPU server keeps its own CUDA build of torch and
#              triton; install there with `scripts/install_offline.sh OUT_DIR --system-site-packages`); globs work
# --extras     optional dependency groups of pyproject.toml to include too (gpu: cupy, NVML)
# --with       extra requirement specifiers, e.g. a pin of the torch build to carry ("torch==2.13.0")
#
# Install on the host, with no network:  scripts/install_offline.sh OUT_DIR [VENV]
# (that is: pip install --no-index --find-links OUT_DIR kernel-optimizer-appliance[EXTRAS] in a fresh venv).
# OUT_DIR/wheelhouse.env records how it was built; install_offline.sh reads it.
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
out=${1:?usage: build_wheelhouse.sh OUT_DIR [--python X.Y] [--platform TAG] [--without "pkg ..."] [--extras "x ..."] [--with "spec ..."]}
shift
python_version=$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
platform=manylinux_2_28_x86_64
without=""
extras=""
with=""
while [ $# -gt 0 ]; do
  case $1 in
    --python) python_version=$2; shift 2 ;;
    --platform) platform=$2; shift 2 ;;
    --without) without=$2; shift 2 ;;
    --extras) extras=$2; shift 2 ;;
    --with) with=$2; shift 2 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
mkdir -p "$out"
out=$(cd "$out" && pwd)

# 1. The appliance itself, built from a clean copy of the source tree (tracked and untracked-but-not-ignored files):
#    an in-tree build would also pack stale modules left in build/ and could pick up OUT_DIR itself.
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
python3 - "$repo" "$src" "$out" <<'PY'
import os, shutil, subprocess, sys
repo, dst, out = sys.argv[1:4]
try:
    files = subprocess.run(["git", "-C", repo, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                           check=True, capture_output=True).stdout.decode().split("\0")
except (OSError, subprocess.CalledProcessError):  # not a git checkout (an unpacked release): copy, minus the usual junk
    junk = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache", ".whl")
    shutil.copytree(repo, dst, ignore=junk, dirs_exist_ok=True)
    sys.exit()
for f in filter(None, files):
    path = os.path.join(repo, f)
    if os.path.isfile(path) and not path.startswith(out + os.sep):  # skip deleted-but-tracked files, and OUT_DIR
        os.makedirs(os.path.join(dst, os.path.dirname(f)), exist_ok=True)
        shutil.copy2(os.path.join(repo, f), os.path.join(dst, f))
PY
rm -f "$out"/kernel_optimizer_appliance-*.whl
python3 -m pip wheel --quiet --no-deps --wheel-dir "$out" "$src"

# 2. Its dependencies from pyproject.toml (plus --extras groups and --with specs, minus --without), resolved for the
#    target interpreter and platform, binary wheels only.
req_lines=$(python3 - "$repo/pyproject.toml" "$without" "$extras" "$with" <<'PY'
import fnmatch, re, sys
try:
    import tomllib
except ImportError:  # Python < 3.11 on the connected machine
    import tomli as tomllib
project = tomllib.load(open(sys.argv[1], "rb"))["project"]
deps = list(project["dependencies"])
for extra in sys.argv[3].split():
    if extra not in project.get("optional-dependencies", {}):
        sys.exit(f"build_wheelhouse: no optional dependency group {extra!r} in pyproject.toml")
    deps += project["optional-dependencies"][extra]
norm = lambda name: re.sub(r"[-_.]+", "-", name).lower()
skip = [norm(p) for p in sys.argv[2].split()]
for d in deps:
    name = norm(re.split(r"[<>=!~\[; ]", d, maxsplit=1)[0])
    if not any(fnmatch.fnmatch(name, pattern) for pattern in skip):
        print(d)
for spec in sys.argv[4].split():
    print(spec)
PY
)
mapfile -t reqs <<< "$req_lines"
platforms=()
for n in 17 27 28 31 34; do platforms+=(--platform "manylinux_2_${n}_x86_64"); done
[ "$platform" != manylinux_2_28_x86_64 ] && platforms=(--platform "$platform")
python3 -m pip download --quiet --only-binary=:all: --python-version "$python_version" --implementation cp \
  "${platforms[@]}" --platform manylinux2014_x86_64 --dest "$out" "${reqs[@]}"

# 3. The jail's tools, for hosts that lack them (install_offline.sh installs them with dpkg -i, or unpack: dpkg -x).
if command -v apt-get >/dev/null; then
  for deb in bubblewrap libseccomp2; do
    (cd "$out" && apt-get download "$deb" >/dev/null 2>&1) || echo "warning: could not download the $deb .deb" >&2
  done
fi

# 4. How it was built, for install_offline.sh (KEY=value lines).
cat > "$out/wheelhouse.env" <<EOF
python=$python_version
platform=$platform
extras=$extras
without=$without
with=$with
EOF
ls "$out"
