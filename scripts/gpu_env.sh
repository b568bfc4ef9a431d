# Source on a GPU host that has torch/triton but not the appliance (the lent GPU machine): installs the carried
# wheelhouse (.whl, built by scripts/build_wheelhouse.sh .whl --python 3.12 --without "torch triton numpy") into
# /tmp/appliance-site, unpacks bubblewrap when the host lacks it, and exports what the appliance needs.
#
#   source scripts/gpu_env.sh && python3 -m appliance doctor
site=/tmp/appliance-site
if [ ! -d "$site/sqlmodel" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" \
    $(ls .whl/*.whl | grep -v kernel_optimizer_appliance) >/dev/null 2>&1 || echo "gpu_env: wheel install failed" >&2
fi
export PYTHONPATH="$PWD:$site" PYTHONUNBUFFERED=1
if ! command -v bwrap >/dev/null; then
  [ -x /tmp/bwrap-root/usr/bin/bwrap ] || dpkg -x .whl/bubblewrap_*.deb /tmp/bwrap-root
  export APPLIANCE_BWRAP=/tmp/bwrap-root/usr/bin/bwrap
fi
export APPLIANCE_HOME=${APPLIANCE_HOME:-/dev/shm/appliance}  # job dirs hold gigabytes of inputs: keep them in memory
