# Source after scripts/gpu_env.sh on the lent GPU machine, to try the Ray executor there: unpacks the trimmed Ray
# and its dependencies from .whl-ray (built by scripts/build_ray_carry.sh: Ray's wheel alone does not fit the
# machine's 64 MiB carry beside the wheelhouse) into /tmp/ray-site.
ray_site=/tmp/ray-site
if [ ! -d "$ray_site/ray" ]; then
  mkdir -p "$ray_site" && tar xJf .whl-ray/ray-trim.tar.xz -C "$ray_site" &&
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$ray_site" .whl-ray/deps/*.whl >/dev/null 2>&1 ||
    echo "gpu_ray_env: unpacking Ray failed" >&2
fi
export PYTHONPATH="$PYTHONPATH:$ray_site"
ray_cli() { python3 -m ray.scripts.scripts "$@"; }
