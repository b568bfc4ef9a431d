#!/usr/bin/env bash
# Install the appliance on the air-gapped host from a wheelhouse made by scripts/build_wheelhouse.sh: a venv with the
# appliance and its dependencies, nothing fetched from anywhere (pip --no-index: only files in WHEELHOUSE).
#
#   scripts/install_offline.sh WHEELHOUSE [VENV] [--extras "gpu"] [--system-site-packages] [--python python3.12]
#                                               [--no-debs]
#
# VENV                    default /opt/appliance/venv (what the systemd units run); created when absent, else updated
# --extras                optional groups to install (default: those the wheelhouse was built with)
# --system-site-packages  the new venv also sees the host interpreter's packages: for a wheelhouse built
#                         --without "torch triton numpy" on a GPU server that keeps its own CUDA build of torch
# --python                interpreter to create the venv with (default: python3); its X.Y must be the wheelhouse's
# --no-debs               do not install bubblewrap / libseccomp2 from the wheelhouse's .debs when the host lacks them
# Then: VENV/bin/appliance doctor, and scripts/install_services.sh for the systemd units.
set -euo pipefail

usage="usage: install_offline.sh WHEELHOUSE [VENV] [--extras \"x ...\"] [--system-site-packages] [--python PY] [--no-debs]"
wheelhouse=""; venv=""; extras="unset"; system_site=0; python=python3; debs=1
while [ $# -gt 0 ]; do
  case $1 in
    --extras) extras=$2; shift 2 ;;
    --system-site-packages) system_site=1; shift ;;
    --python) python=$2; shift 2 ;;
    --no-debs) debs=0; shift ;;
    -h|--help) echo "$usage"; exit 0 ;;
    -*) echo "unknown argument: $1" >&2; echo "$usage" >&2; exit 2 ;;
    *) if [ -z "$wheelhouse" ]; then wheelhouse=$1; elif [ -z "$venv" ]; then venv=$1; else echo "$usage" >&2; exit 2; fi
       shift ;;
  esac
done
[ -n "$wheelhouse" ] || { echo "$usage" >&2; exit 2; }
venv=${venv:-/opt/appliance/venv}
die() { echo "install_offline: error: $*" >&2; exit 1; }

[ -d "$wheelhouse" ] || die "no wheelhouse directory $wheelhouse"
wheelhouse=$(cd "$wheelhouse" && pwd)
wheel=$(ls "$wheelhouse"/kernel_optimizer_appliance-*.whl 2>/dev/null | sort -V | tail -1 || true)
[ -n "$wheel" ] || die "$wheelhouse holds no kernel_optimizer_appliance-*.whl: build the wheelhouse on a connected
machine with scripts/build_wheelhouse.sh OUT_DIR --python X.Y and carry OUT_DIR here"

# How the wheelhouse was built (scripts/build_wheelhouse.sh writes wheelhouse.env).
built_python=""; built_extras=""; built_without=""
if [ -f "$wheelhouse/wheelhouse.env" ]; then
  built_python=$(sed -n 's/^python=//p' "$wheelhouse/wheelhouse.env")
  built_extras=$(sed -n 's/^extras=//p' "$wheelhouse/wheelhouse.env")
  built_without=$(sed -n 's/^without=//p' "$wheelhouse/wheelhouse.env")
fi
[ "$extras" = unset ] && extras=$built_extras

# No network, and no pip configuration either: a pip.conf or PIP_* variable on this host could add an index or
# other find-links; only the wheelhouse counts.
while read -r name; do unset "$name"; done < <(env | sed -n 's/^\(PIP_[A-Za-z0-9_]*\)=.*/\1/p')
export PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1

version_of() { "$1" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")'; }
if [ -x "$venv/bin/python" ]; then
  have=$(version_of "$venv/bin/python")
  [ $system_site = 1 ] && echo "note: $venv exists: --system-site-packages only applies to a new venv" >&2
  [ -z "$built_python" ] || [ "$have" = "$built_python" ] || die "$venv has Python $have but the wheelhouse is for \
Python $built_python: remove the venv, or rebuild the wheelhouse with --python $have"
  echo "updating $venv (Python $have)"
else
  command -v "$python" >/dev/null || die "no interpreter $python (pass --python python3.X)"
  have=$(version_of "$python")
  [ -z "$built_python" ] || [ "$have" = "$built_python" ] || die "$python is Python $have but the wheelhouse is for \
Python $built_python: pass --python python$built_python, or rebuild the wheelhouse with --python $have"
  flags=(); [ $system_site = 1 ] && flags=(--system-site-packages)
  mkdir -p "$(dirname "$venv")"
  "$python" -m venv "${flags[@]}" "$venv" || die "could not create a venv with $python (Debian/Ubuntu: the \
python$have-venv package)"
  note=""; [ $system_site = 1 ] && note=", with the host interpreter's site-packages"
  echo "created $venv (Python $have$note)"
fi

spec="$wheel"
[ -n "${extras// /}" ] && spec="${wheel}[$(echo $extras | tr ' ' ',')]"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
pip=("$venv/bin/python" -m pip install --no-index --find-links "$wheelhouse" --only-binary=:all:)
if ! "${pip[@]}" "$spec" >"$log" 2>&1; then
  cat "$log" >&2
  missing=$(sed -n 's/.*No matching distribution found for \(.*\)/\1/p' "$log" | head -1)
  if [ -n "$missing" ]; then
    hint="rebuild the wheelhouse on a connected machine (scripts/build_wheelhouse.sh OUT_DIR --python $have"
    hint+="${extras:+ --extras \"$extras\"})"
    if [ -n "$built_without" ]; then
      hint="it was built --without \"$built_without\", so this host must provide those: rerun with a new venv and
--system-site-packages if $python has them (a GPU server's CUDA torch), or $hint"
    fi
    die "the wheelhouse $wheelhouse has no wheel for $missing (needed by the appliance${extras:+[$extras]});
$hint"
  fi
  grep -q "is not a supported wheel on this platform" "$log" &&
    die "a wheel in $wheelhouse does not fit this host (Python $have, $(uname -m)): rebuild it for this host"
  die "pip could not install from $wheelhouse (its output is above)"
fi
grep -v "^Looking in links" "$log" | tail -3
# The same version number may have been rebuilt: always install the wheelhouse's build of the appliance itself.
"$venv/bin/python" -m pip install --quiet --no-index --no-deps --force-reinstall "$wheel"
"$venv/bin/appliance" --help >/dev/null || die "$venv/bin/appliance does not run"
echo "installed $(basename "$wheel")${extras:+ [$extras]} into $venv"

# The jail's system tools: bubblewrap, and libseccomp for the seccomp filter.
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
{ ldconfig -p 2>/dev/null || true; } | grep -q 'libseccomp\.so\.2' || need+=(libseccomp2)
if [ ${#need[@]} -gt 0 ]; then
  debs_found=()
  for name in "${need[@]}"; do
    f=$(ls "$wheelhouse/${name}"_*.deb 2>/dev/null | head -1 || true); [ -n "$f" ] && debs_found+=("$f")
  done
  if [ $debs = 1 ] && [ "$(id -u)" = 0 ] && command -v dpkg >/dev/null && [ ${#debs_found[@]} = ${#need[@]} ]; then
    dpkg -i "${debs_found[@]}" || echo "warning: dpkg could not install ${need[*]}: install them by hand" >&2
  else
    echo "warning: this host lacks ${need[*]}: the jail fails closed without them (appliance doctor says so);" \
         "install them (dpkg -i $wheelhouse/*.deb as root, or your distribution's packages)" >&2
  fi
fi
echo "next: $venv/bin/appliance doctor; scripts/install_services.sh (systemd units)"
