"""Operations files: the systemd units (systemd-analyze verify, and the settings the jail depends on), the service
installer, and an offline install from a wheelhouse into a fresh venv with no network."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
UNITS = REPO / "systemd"
INSTALLED_RAY = "/opt/appliance/venv/bin/ray"
WORKER = "appliance-worker@.service"  # a template: one instance per evaluation GPU
UNIT_NAMES = ("appliance-vllm.service", "appliance-controller.service", "appliance-ray-worker.service", WORKER)
JAIL_UNITS = ("appliance-controller.service", "appliance-ray-worker.service", WORKER)  # they run bubblewrap
INSTALLED_APPLIANCE = "/opt/appliance/venv/bin/appliance"


def parse_unit(path: Path) -> dict[str, dict[str, list[str]]]:
    """A systemd unit file: section -> key -> every value (keys may repeat), continuation lines joined."""
    sections: dict[str, dict[str, list[str]]] = {}
    current = None
    text = re.sub(r"\\\n", " ", path.read_text())
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def service(name: str) -> dict[str, list[str]]:
    return parse_unit(UNITS / name)["Service"]


def _verify(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["systemd-analyze", "verify", "--man=no", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120)


def _instance(name: str) -> str:
    """systemd-analyze (252) skips a bare template without a word: verify an instance of it, loaded from the
    template file beside it."""
    return name.replace("@.", "@1.")


@pytest.mark.skipif(shutil.which("systemd-analyze") is None,
                    reason="systemd-analyze not installed (Debian package `systemd`; scripts/test.sh installs it)")
def test_units_pass_systemd_analyze_verify(tmp_path):
    # verify insists that ExecStart= binaries exist: point the copies at an executable that does (the appliance of
    # the venv running the tests), everything else exactly as shipped.
    exe = Path(sys.executable).with_name("appliance")
    exe = exe if os.access(exe, os.X_OK) else Path(shutil.which("true"))
    ray = Path(sys.executable).with_name("ray")
    ray = ray if os.access(ray, os.X_OK) else Path(shutil.which("true"))
    for name in UNIT_NAMES:
        text = (UNITS / name).read_text()
        assert INSTALLED_APPLIANCE in text or INSTALLED_RAY in text
        text = text.replace(INSTALLED_APPLIANCE, str(exe)).replace(INSTALLED_RAY, str(ray))
        (tmp_path / name).write_text(text)
    result = _verify([f"./{_instance(n)}" for n in UNIT_NAMES], tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # Unknown keys and bad values are only warnings (exit 0): none may mention our units.
    assert not [line for line in output.splitlines() if "appliance" in line], output


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
@pytest.mark.parametrize("name", ["appliance-controller.service", WORKER])
def test_verify_catches_a_broken_unit(tmp_path, name):
    """The verify test above can fail: a misspelt key and a missing binary are reported (in a template too)."""
    missing = tmp_path / "no-venv/bin/appliance"
    text = (UNITS / name).read_text().replace("NoNewPrivileges=", "NoNewPrivilege=")
    (tmp_path / name).write_text(text.replace(INSTALLED_APPLIANCE, str(missing)))
    result = _verify([f"./{_instance(name)}"], tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode != 0 and str(missing) in output
    assert "NoNewPrivilege" in output


def test_units_run_the_right_commands_with_the_shared_config():
    starts = {name: service(name)["ExecStart"] for name in UNIT_NAMES}
    assert starts["appliance-vllm.service"] == [
        f"{INSTALLED_APPLIANCE} model serve --gpu ${{APPLIANCE_LLM_GPU}} ${{APPLIANCE_MODEL_PROFILE}} "
        "$APPLIANCE_MODEL_SERVE_ARGS"]
    assert starts["appliance-controller.service"] == [f"{INSTALLED_APPLIANCE} controller $APPLIANCE_CONTROLLER_ARGS"]
    assert starts["appliance-ray-worker.service"][0].startswith("/opt/appliance/venv/bin/ray start --block")
    assert starts[WORKER] == [f"{INSTALLED_APPLIANCE} worker --gpu %i $APPLIANCE_WORKER_ARGS"]
    example = (UNITS / "appliance.env.example").read_text()
    for name in UNIT_NAMES:
        s = service(name)
        # A worker is ready when its socket listens (sd_notify): the controller, ordered after it, then uses it.
        assert s["User"] == ["appliance"] and s["Type"] == (["notify"] if name == WORKER else ["exec"])
        assert s["EnvironmentFile"] == ["/etc/appliance/appliance.env"]
        assert "APPLIANCE_HOME=/var/lib/appliance" in s["Environment"]
        if name != "appliance-vllm.service":  # the units that evaluate keep their job folders in memory
            assert "APPLIANCE_JOBS_DIR=/dev/shm/appliance-jobs" in s["Environment"], name
        assert s["StandardOutput"] == ["journal"] and s["StandardError"] == ["journal"]
        assert s["Restart"] == ["on-failure"]
        assert parse_unit(UNITS / name)["Install"]["WantedBy"][0].split()[0] == "multi-user.target"
        # Every setting a unit reads from the environment is documented in the example config.
        for var in re.findall(r"\$\{?(APPLIANCE_[A-Z_]+)", " ".join(s["ExecStart"])):
            assert re.search(rf"^#?{var}=", example, re.M), f"{var} is not in appliance.env.example"
    assert re.search(r"^APPLIANCE_MODEL_PROFILE=\S", example, re.M)
    assert re.search(r"^APPLIANCE_LLM_GPU=0$", example, re.M)
    # Enabled workers start with the controller, and before it: it finds them listening instead of starting its own.
    worker = parse_unit(UNITS / WORKER)
    assert "appliance-controller.service" in worker["Install"]["WantedBy"][0].split()
    assert worker["Unit"]["Before"] == ["appliance-controller.service"]


def test_unit_commands_exist_in_the_cli():
    from typer.testing import CliRunner

    from appliance.cli import app

    runner = CliRunner()
    serve = runner.invoke(app, ["model", "serve", "--help"])
    assert serve.exit_code == 0 and "--gpu" in serve.output
    controller = runner.invoke(app, ["controller", "--help"])
    assert controller.exit_code == 0 and "--metrics-port" in controller.output
    worker = runner.invoke(app, ["worker", "--help"])
    assert worker.exit_code == 0 and "--gpu" in worker.output and "--socket" in worker.output


def test_every_unit_is_hardened():
    for name in UNIT_NAMES:
        s = service(name)
        for key, value in (("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("PrivateTmp", "yes"),
                           ("ProtectHome", "yes"), ("CapabilityBoundingSet", ""), ("StateDirectory", "appliance"),
                           ("SystemCallArchitectures", "native"), ("RestrictSUIDSGID", "yes")):
            assert s.get(key) == [value], f"{name}: {key}"
        assert "AF_NETLINK" in s["RestrictAddressFamilies"][0]  # bwrap's loopback; NCCL's getifaddrs
        # CUDA needs the /dev/nvidia* nodes: no private /dev and no device allow-list, explicit or implied.
        for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "MemoryDenyWriteExecute"):
            assert key not in s, f"{name}: {key} would break CUDA or the JIT compilers"
    vllm = service("appliance-vllm.service")
    assert vllm["RestrictNamespaces"] == ["yes"] and vllm["ProtectControlGroups"] == ["yes"]
    assert vllm["IPAddressDeny"] == ["any"] and vllm["IPAddressAllow"] == ["localhost"]


@pytest.mark.parametrize("name", JAIL_UNITS)
def test_jail_units_keep_what_the_jail_needs(name):
    s = service(name)
    assert s["Delegate"] == ["yes"]  # per-candidate cgroups below the unit's
    assert s["OOMPolicy"] == ["continue"]  # a candidate's OOM kill costs one verdict, not the service
    assert s["KillMode"] == ["mixed"]  # SIGTERM reaches the main process only: it finishes the candidate in flight
    # bwrap needs user namespaces, writable cgroups, a fresh /proc (no /proc over-mounts, no /proc subset).
    for key in ("RestrictNamespaces", "ProtectControlGroups", "ProtectKernelTunables", "ProtectKernelLogs",
                "ProtectHostname", "ProtectProc", "ProcSubset", "PrivateUsers", "PrivateNetwork", "IPAddressDeny"):
        assert key not in s, f"{name}: {key} would break the jail or the controller's clients"
    assert "CUDA_VISIBLE_DEVICES" not in " ".join(s.get("Environment", []))  # the jail picks GPUs by index
    assert any(cmd.startswith("+/bin/sh") and "chown appliance:appliance" in cmd for cmd in s["ExecStartPre"])


def test_install_services_into_a_prefix(tmp_path):
    root = tmp_path / "root"
    cmd = ["bash", str(REPO / "scripts/install_services.sh"), "--prefix", str(root), "--venv", "/srv/app/venv"]
    result = subprocess.run(cmd + ["--worker-gpus", "1,2"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "not running systemctl" in result.stdout and "appliance-controller.service" in result.stdout
    assert "appliance-worker@1.service appliance-worker@2.service" in result.stdout  # an instance per GPU
    for name in UNIT_NAMES:
        installed = (root / "etc/systemd/system" / name).read_text()
        assert "/opt/appliance/venv" not in installed and "/srv/app/venv/bin/" in installed
        assert (root / "etc/systemd/system" / name).stat().st_mode & 0o777 == 0o644
    env = root / "etc/appliance/appliance.env"
    assert env.stat().st_mode & 0o777 == 0o640  # may hold a database password
    assert (root / "etc/appliance/appliance.env.example").is_file()
    assert (root / "etc/appliance/models/qwen3-coder-30b-a3b-fp8.toml").is_file()
    assert (root / "opt/appliance/benchmarks/tasks/softmax.py").is_file()
    assert (root / "var/lib/appliance").is_dir() and (root / "var/cache/appliance").is_dir()
    # A second run keeps the operator's configuration.
    env.write_text("APPLIANCE_MODEL_PROFILE=mine\n")
    result = subprocess.run(cmd + ["--no-enable"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "keeping the existing" in result.stdout
    assert env.read_text() == "APPLIANCE_MODEL_PROFILE=mine\n"


def _install_offline(*args, timeout=600, offline=True) -> subprocess.CompletedProcess:
    cmd = ["bash", str(REPO / "scripts/install_offline.sh"), *map(str, args)]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PIP_", "VIRTUAL_ENV"))}
    # Any attempt to reach an index fails at once (the script also drops every pip setting and passes --no-index).
    env.update(PIP_INDEX_URL="http://127.0.0.1:9/simple", no_proxy="*")
    if offline and _can_unshare_net():
        cmd = ["unshare", "--net", "--", *cmd]  # no network at all: only the loopback, and it is down
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def _can_unshare_net() -> bool:
    try:
        return subprocess.run(["unshare", "--net", "true"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_install_offline_explains_an_unusable_wheelhouse(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    result = _install_offline(empty, tmp_path / "venv")
    assert result.returncode == 1 and "build_wheelhouse.sh" in result.stderr
    other = tmp_path / "py399"
    other.mkdir()
    (other / "kernel_optimizer_appliance-0.1.0-py3-none-any.whl").write_bytes(b"")
    (other / "wheelhouse.env").write_text("python=3.99\nextras=\nwithout=\n")
    result = _install_offline(other, tmp_path / "venv", "--python", sys.executable)
    assert result.returncode == 1 and "for Python 3.99" in result.stderr and "--python" in result.stderr
    assert not (tmp_path / "venv").exists()


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory):
    """scripts/build_wheelhouse.sh for this interpreter, carrying the torch, triton and numpy builds under test
    (torch's CPU wheel: the pin keeps pip from choosing the CUDA build and gigabytes of nvidia-* wheels)."""
    torch = pytest.importorskip("torch")
    if torch.version.cuda:
        pytest.skip("this interpreter's torch is a CUDA build: its wheelhouse would be gigabytes")
    from importlib.metadata import version

    out = tmp_path_factory.mktemp("wheelhouse")
    pins = f"torch=={torch.__version__} triton=={version('triton')} numpy=={version('numpy')}"
    py = f"{sys.version_info[0]}.{sys.version_info[1]}"
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")  # python3 = this venv's
    result = subprocess.run(["bash", str(REPO / "scripts/build_wheelhouse.sh"), str(out), "--python", py,
                             "--with", pins], capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    yield out
    shutil.rmtree(out, ignore_errors=True)


@pytest.mark.slow
def test_offline_install_into_a_fresh_venv(wheelhouse, tmp_path):
    """The wheelhouse holds the appliance and everything it needs: a fresh venv gets it all with no network, and the
    installed `appliance` (not this checkout) runs."""
    wheels = {p.name.split("-")[0].lower() for p in wheelhouse.glob("*.whl")}
    assert {"kernel_optimizer_appliance", "torch", "triton", "numpy", "sqlmodel", "pyseccomp"} <= wheels
    assert "python=" in (wheelhouse / "wheelhouse.env").read_text()
    venv = tmp_path / "venv"
    try:
        result = _install_offline(wheelhouse, venv, "--python", sys.executable)
        assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
        assert "installed kernel_optimizer_appliance-" in result.stdout
        run = dict(cwd=tmp_path, capture_output=True, text=True, timeout=300,  # cwd: not this checkout
                   env={"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "APPLIANCE_HOME": str(tmp_path / "home")})
        where = subprocess.run([venv / "bin/python", "-c", "import appliance, sandbox, torch; "
                                "print(appliance.__file__, sandbox.__file__, torch.__file__)"], **run)
        assert where.returncode == 0, where.stderr
        assert all(p.startswith(str(venv)) for p in where.stdout.split()), where.stdout
        helped = subprocess.run([venv / "bin/appliance", "--help"], **run)
        assert helped.returncode == 0 and "Usage" in helped.stdout, helped.stderr
        doctor = subprocess.run([venv / "bin/appliance", "doctor", "--json"], **run)
        report = json.loads(doctor.stdout)  # it may find this host unfit (non-zero exit); it must run and answer
        assert {c["name"] for c in report["checks"]} >= {"bubblewrap", "seccomp", "database"}
        # The suite and the model profiles came with the wheel (its data files), not from this checkout.
        tasks = subprocess.run([venv / "bin/appliance", "tasks"], **run)
        assert tasks.returncode == 0 and "softmax" in tasks.stdout, tasks.stdout + tasks.stderr
        profiles = subprocess.run([venv / "bin/appliance", "model", "list", "--json"], **run)
        assert profiles.returncode == 0 and "qwen3-coder-30b-a3b-fp8" in profiles.stdout, profiles.stderr
        # The installed appliance (a wheel in site-packages, not this checkout) evaluates a candidate in the jail.
        evaluated = subprocess.run([venv / "bin/appliance", "eval", REPO / "tests/fixtures/tasks/rowsoftmax.py",
                                    REPO / "tests/fixtures/candidates/good.py", "--device", "cpu", "--baselines",
                                    "eager", "--timing-budget", "0.05", "--json"], **run)
        assert evaluated.returncode == 0, evaluated.stdout[-2000:] + evaluated.stderr[-2000:]
    finally:
        shutil.rmtree(venv, ignore_errors=True)


@pytest.mark.slow
def test_offline_install_names_what_the_wheelhouse_lacks(wheelhouse, tmp_path):
    """A wheelhouse built --without torch on a host without torch: the error says which package and what to do."""
    partial = tmp_path / "partial"
    partial.mkdir()
    for p in wheelhouse.glob("*.whl"):
        if not p.name.startswith("torch-"):
            os.symlink(p, partial / p.name)
    (partial / "wheelhouse.env").write_text(
        (wheelhouse / "wheelhouse.env").read_text().replace("without=\n", "without=torch\n"))
    result = _install_offline(partial, tmp_path / "venv", "--python", sys.executable)
    assert result.returncode == 1
    assert "has no wheel for torch" in result.stderr and "--system-site-packages" in result.stderr, result.stderr
