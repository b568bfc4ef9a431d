#!/usr/bin/env bash
# Install the appliance's systemd units on the appliance host, as root, after scripts/install_offline.sh:
# the `appliance` system user, /var/lib/appliance (state) and /var/cache/appliance, /etc/appliance/appliance.env
# (from systemd/appliance.env.example, only when absent), the model profiles in /etc/appliance/models and the task
# suite in /opt/appliance/benchmarks (files already there are kept), the units in /etc/systemd/system; then
# `systemctl daemon-reload` and enable appliance-vllm, appliance-controller and one appliance-worker@N per evaluation
# GPU (every GPU nvidia-smi lists except APPLIANCE_LLM_GPU of appliance.env; appliance-worker@cpu without GPUs).
# Nothing is started: edit /etc/appliance/appliance.env first.
#
#   scripts/install_services.sh [--prefix /] [--no-enable] [--venv /opt/appliance/venv] [--worker-gpus 1,2,3]
#
# --prefix       install under another root directory (an image, a package build, a test): no user is created and
#                systemctl is not run
# --no-enable    copy only; no systemctl
# --venv         where install_offline.sh put the appliance (written into the units' ExecStart=)
# --worker-gpus  the evaluation GPUs to enable a worker for (nvidia-smi indices, or cpu), instead of asking nvidia-smi
set -euo pipefail

repo=$(cd "$(dirname "$0")/.." && pwd)
prefix=/; enable=1; venv=/opt/appliance/venv; worker_gpus=
while [ $# -gt 0 ]; do
  case $1 in
    --prefix) prefix=$2; shift 2 ;;
    --no-enable) enable=0; shift ;;
    --venv) venv=$2; shift 2 ;;
    --worker-gpus) worker_gpus=$2; shift 2 ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
root=${prefix%/}  # "" for the real root
host=0; [ -z "$root" ] && host=1
if [ $host = 1 ] && [ "$(id -u)" != 0 ]; then
  echo "install_services: run as root (or --prefix DIR to install into a directory)" >&2; exit 1
fi
say() { echo "install_services: $*"; }

# 1. The service user: a system account with no login, its home the state directory, in the groups that own GPU
#    device nodes on distributions that restrict them (video, render).
if [ $host = 1 ]; then
  if ! getent passwd appliance >/dev/null; then
    useradd --system --user-group --home-dir /var/lib/appliance --no-create-home \
      --shell /usr/sbin/nologin --comment "Kernel Optimizer Appliance" appliance
    say "created system user appliance"
  fi
  for g in video render; do
    getent group "$g" >/dev/null && usermod -a -G "$g" appliance
  done
else
  say "--prefix $prefix: not creating the appliance user (create it on the host: useradd --system appliance)"
fi
owner() {  # chown to appliance where that user exists (always on the host; under --prefix only if it exists here)
  if getent passwd appliance >/dev/null; then chown "$@"; fi
}

# 2. Directories. systemd also creates the state and cache directories (StateDirectory=, CacheDirectory=); making
#    them here lets `appliance` run by hand as that user before the first start.
install -d -m 0755 "$root/etc/appliance" "$root/etc/appliance/models" "$root/etc/systemd/system" \
  "$root/opt/appliance/benchmarks"
install -d -m 0750 "$root/var/lib/appliance" "$root/var/cache/appliance"
owner appliance:appliance "$root/var/lib/appliance" "$root/var/cache/appliance"

# 3. Configuration: the example always (it documents every setting), appliance.env only when absent. It may hold
#    a database password or an API key: readable by root and the appliance group only.
install -m 0644 "$repo/systemd/appliance.env.example" "$root/etc/appliance/appliance.env.example"
if [ -e "$root/etc/appliance/appliance.env" ]; then
  say "keeping the existing $root/etc/appliance/appliance.env"
else
  sed "s#/opt/appliance/venv#$venv#g" "$repo/systemd/appliance.env.example" > "$root/etc/appliance/appliance.env"
  chmod 0640 "$root/etc/appliance/appliance.env"
  owner root:appliance "$root/etc/appliance/appliance.env"
  say "wrote $root/etc/appliance/appliance.env: set APPLIANCE_MODEL_PROFILE and the LLM settings there"
fi

# 4. Model profiles (an operator edits them: copied once, never overwritten) and the bundled task suite, which the
#    appliance's wheel does not carry (APPLIANCE_MODEL_PROFILES and APPLIANCE_SUITE in appliance.env point here).
for f in "$repo"/models/*.toml; do
  [ -e "$f" ] || continue
  dest="$root/etc/appliance/models/$(basename "$f")"
  [ -e "$dest" ] || install -m 0644 "$f" "$dest"
done
for d in tasks baselines; do
  if [ -d "$repo/benchmarks/$d" ]; then
    rm -rf "$root/opt/appliance/benchmarks/$d"
    cp -r "$repo/benchmarks/$d" "$root/opt/appliance/benchmarks/$d"
    find "$root/opt/appliance/benchmarks/$d" -name __pycache__ -prune -exec rm -rf {} +
  fi
done

# 5. The units, with ExecStart= pointing at the venv (the Ray worker unit too: enable it only on extra GPU hosts).
for unit in appliance-vllm.service appliance-controller.service appliance-ray-worker.service \
    appliance-worker@.service; do
  sed "s#/opt/appliance/venv#$venv#g" "$repo/systemd/$unit" > "$root/etc/systemd/system/$unit"
  chmod 0644 "$root/etc/systemd/system/$unit"
done
say "installed the units in $root/etc/systemd/system"
[ -x "$root$venv/bin/appliance" ] || echo "install_services: warning: no $root$venv/bin/appliance yet:" \
  "install it with scripts/install_offline.sh WHEELHOUSE $venv" >&2

# 6. systemd itself: vLLM, the controller, and an evaluation worker per evaluation GPU (instance = GPU index).
evaluation_gpus() {
  if [ -n "$worker_gpus" ]; then echo "$worker_gpus" | tr ',' ' '; return; fi
  local llm all
  llm=$(sed -n 's/^APPLIANCE_LLM_GPU=\([0-9][0-9]*\).*/\1/p' "$root/etc/appliance/appliance.env" | tail -n 1)
  all=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr -d ' ' || true)
  if [ -z "$all" ]; then echo cpu; return; fi  # no GPU (or no driver): the CPU worker
  echo "$all" | grep -vx "${llm:-0}" | tr '\n' ' ' || true  # the LLM's GPU never evaluates
}
units=(appliance-vllm.service appliance-controller.service)
if [ $host = 1 ] || [ -n "$worker_gpus" ]; then
  workers=$(evaluation_gpus)
  [ -n "$workers" ] || echo "install_services: warning: no evaluation GPU (the only GPU is APPLIANCE_LLM_GPU's):" \
    "no worker enabled; pass --worker-gpus" >&2
  for g in $workers; do units+=("appliance-worker@$g.service"); done
else
  say "--prefix without --worker-gpus: enable appliance-worker@N.service for each evaluation GPU on the host"
fi
if [ $enable = 0 ]; then
  say "--no-enable: not running systemctl"
elif [ $host = 0 ]; then
  say "--prefix $prefix: not running systemctl (enable on the host: systemctl enable ${units[*]})"
elif [ ! -d /run/systemd/system ]; then
  say "systemd is not running as PID 1 here (a container?): skipped systemctl daemon-reload and enable;" \
      "on the appliance host run: systemctl daemon-reload && systemctl enable ${units[*]}"
else
  systemctl daemon-reload
  systemctl enable "${units[@]}"
  say "enabled ${units[*]}; after editing /etc/appliance/appliance.env: systemctl start ${units[*]}"
  say "check the jail under the units' sandbox: journalctl -u appliance-controller, and" \
      "sudo -u appliance $venv/bin/appliance doctor"
fi
