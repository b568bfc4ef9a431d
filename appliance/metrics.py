"""Prometheus metrics of the controller (prometheus-client; conventional names, base units).

    appliance_candidates_total{verdict,proposer}     candidates judged (proposal failures: verdict "proposal_failed")
    appliance_evaluation_seconds{stage}              wall seconds per evaluation process (prepare, candidate, check)
    appliance_gpu_seconds_total{host,gpu}            seconds each evaluation GPU was held by an evaluation (its
                                                     correctness and timing turns, sandbox/gate.py)
    appliance_energy_joules_total{host,gpu}          NVML energy of each evaluation GPU during those turns
                                                     (0 where there is no GPU or no NVML: never invented)
    appliance_run_best_speedup{run,baseline}         best verified speedup of each run vs eager / torch.compile
    appliance_llm_tokens_total{kind}                 prompt and completion tokens
    appliance_llm_request_seconds                    LLM request latency
    appliance_queue_depth                            candidates waiting for evaluation
    appliance_workers_up{host,gpu}                   evaluation workers ready (1) per GPU ("cpu" on a CPU host): for
                                                     worker processes (appliance/worker.py), whether the worker
                                                     answers on its socket, checked every 5 s
The host is the one that evaluated: this host for local workers and worker processes, the Ray node's host (and node
id) for Ray workers, as the evaluation records it (details.host).
"""

from __future__ import annotations

import socket

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

STAGE_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200)
LLM_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


class Metrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        r = self.registry = registry or CollectorRegistry()
        self.candidates = Counter("appliance_candidates", "Candidates judged, by verdict and proposer",
                                  ["verdict", "proposer"], registry=r)
        self.evaluation_seconds = Histogram("appliance_evaluation_seconds", "Wall seconds per evaluation process",
                                            ["stage"], buckets=STAGE_BUCKETS, registry=r)
        self.gpu_seconds = Counter("appliance_gpu_seconds", "Seconds each evaluation GPU was held by evaluations",
                                   ["host", "gpu"], registry=r)
        self.energy = Counter("appliance_energy_joules", "NVML energy of evaluation GPUs during evaluations",
                              ["host", "gpu"], registry=r)
        self.best_speedup = Gauge("appliance_run_best_speedup", "Best verified speedup of a run",
                                  ["run", "baseline"], registry=r)
        self.llm_tokens = Counter("appliance_llm_tokens", "LLM tokens", ["kind"], registry=r)
        self.llm_seconds = Histogram("appliance_llm_request_seconds", "LLM request latency", buckets=LLM_BUCKETS,
                                     registry=r)
        self.queue_depth = Gauge("appliance_queue_depth", "Candidates waiting for evaluation", registry=r)
        self.workers_up = Gauge("appliance_workers_up", "Evaluation workers ready (answering)", ["host", "gpu"],
                                registry=r)

    def serve(self, port: int, addr: str = "0.0.0.0"):
        """Serve /metrics in a background thread; returns (server, thread)."""
        return start_http_server(port, addr=addr, registry=self.registry)

    def worker_up(self, gpu: int | None, up: bool = True, host: str | None = None) -> None:
        labels = (host or socket.gethostname(), _gpu(gpu))
        self.workers_up.labels(*labels).set(1 if up else 0)
        self.gpu_seconds.labels(*labels).inc(0)  # the series exist from the start, at 0
        self.energy.labels(*labels).inc(0)

    def evaluation(self, outcome, proposer: str) -> None:
        self.candidates.labels(outcome.verdict, proposer).inc()
        wall = outcome.details.get("wall_s") or {}
        for stage, seconds in wall.items():
            if seconds:  # a prepare reused from an earlier candidate took no time and is not an observation
                self.evaluation_seconds.labels(stage).observe(seconds)
        gpu, turns = outcome.details.get("gpu_index"), outcome.details.get("device_turns") or {}
        if gpu is not None and outcome.device == "cuda":
            labels = (outcome.details.get("host") or socket.gethostname(), _gpu(gpu))
            self.gpu_seconds.labels(*labels).inc(turns.get("held_s") or 0.0)
            if turns.get("joules"):
                self.energy.labels(*labels).inc(turns["joules"])

    def proposal(self, proposal, failed: bool) -> None:
        if failed:
            self.candidates.labels("proposal_failed", proposal.proposer).inc()
        if proposal.tokens_in or proposal.tokens_out:
            self.llm_tokens.labels("prompt").inc(proposal.tokens_in)
            self.llm_tokens.labels("completion").inc(proposal.tokens_out)
        if proposal.proposer.partition(":")[0] == "llm" and proposal.latency_s:  # llm, llm:PROFILE
            self.llm_seconds.observe(proposal.latency_s)

    def best(self, run_id: int, vs_eager: float | None, vs_compile: float | None) -> None:
        for baseline, value in (("eager", vs_eager), ("compile", vs_compile)):
            if value:
                self.best_speedup.labels(str(run_id), baseline).set(value)


def _gpu(gpu: int | None) -> str:
    return "cpu" if gpu is None else str(gpu)
