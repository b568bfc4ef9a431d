# Source after scripts/gpu_env.sh on the lent GPU machine, to try the Ray executor there: unpacks Ray from .whl-ray
# (a trimmed Ray wheel, see below, and its pure-Python dependencies) into /tmp/ray-site.
# Ray's wheel (~80 MB) does not fit the machine's 64 MiB carry with the wheelhouse, so .whl-ray holds it unzipped
# without the parts the appliance never loads (jars, rllib, data, tune, train, serve, llm), as ray-trim.tar.xz.
ray_site=/tmp/ray-site
if [ ! -d "$ray_site/ray" ]; then
  mkdir -p "$ray_site" && tar xJf .whl-ray/ray-trim.tar.xz -C "$ray_site" &&
    python3 -m pip install -q --no-index --no-deps --no-compile --target "$ray_site" .whl-ray/deps/*.whl >/dev/null 2>&1 ||
    echo "gpu_ray_env: unpacking Ray failed" >&2
fi
export PYTHONPATH="$PYTHONPATH:$ray_site"
ray_cli() { python3 -m ray.scripts.scripts "$@"; }
