"""The LLM proposer against real HTTP: a tiny stdlib server that misbehaves on purpose, and (marked `llm`) a real vLLM
serving SmolLM2-135M on the CPU, started by scripts/test_llm_server.sh."""

from __future__ import annotations

import os
import socket
import time

import pytest

from appliance.errors import ApplianceError
from appliance.proposers.base import Example, PromptContext
from appliance.proposers.llm import LLMProposer, LLMSettings, check_endpoint, load_templates
from tests.conftest import FIXTURES
from tests.fake_llm import completion

PARENT = """import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return torch.softmax(x, dim=-1)
"""

DIFF_REPLY = """Compute the softmax by hand so it can become a kernel later.
<<<<<<< SEARCH
        return torch.softmax(x, dim=-1)
=======
        e = torch.exp(x - x.max(dim=-1, keepdim=True).values)
        return e / e.sum(dim=-1, keepdim=True)
>>>>>>> REPLACE
"""




def ctx() -> PromptContext:
    return PromptContext(
        task_name="rowsoftmax",
        task_source=(FIXTURES / "tasks" / "rowsoftmax.py").read_text(),
        parent=Example(PARENT, feedback="correct; 1.00x eager", label="best"),
        inspirations=[Example(PARENT.replace("dim=-1", "-1"), feedback="incorrect: max abs error 0.5")],
        history=["build_failed: triton: unknown name tl.foo"],
        backends=["triton"],
        device="cpu (Triton interpreter)",
    )


def proposer(url: str, **kw) -> LLMProposer:
    return LLMProposer(LLMSettings(**{"base_url": url, "model": "fake", "timeout_s": 5, "max_retries": 0, **kw}))


def test_hanging_server_times_out_fast(fake_llm):
    server = fake_llm("hang")
    start = time.perf_counter()
    [p] = proposer(server.url, timeout_s=0.5).propose(ctx(), 1)
    assert p.source is None and p.failure.startswith("llm_timeout:"), p.failure
    assert time.perf_counter() - start < 5 and 0.4 < p.latency_s < 5


def test_dropped_connection_is_unreachable(fake_llm):
    [p] = proposer(fake_llm("drop").url).propose(ctx(), 1)
    assert p.source is None and p.failure.startswith("llm_unreachable:"), p.failure


def test_refused_connection_is_unreachable():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    [p] = proposer(f"http://127.0.0.1:{port}/v1").propose(ctx(), 1)
    assert p.source is None and p.failure.startswith("llm_unreachable:"), p.failure


def test_http_500_is_a_server_error(fake_llm):
    [p] = proposer(fake_llm(500).url).propose(ctx(), 1)
    assert p.source is None and p.failure.startswith("llm_server_error: HTTP 500"), p.failure


def test_retries_after_500(fake_llm):
    server = fake_llm(500, completion(DIFF_REPLY))
    [p] = proposer(server.url, max_retries=1).propose(ctx(), 1)
    assert p.source is not None and len(server.requests) == 2


@pytest.mark.parametrize("body", [{**completion(""), "choices": []}, {"hello": "world"}, "<html>gateway</html>"],
                         ids=["no-choices", "not-a-completion", "html"])
def test_answer_without_choices(fake_llm, body):
    [p] = proposer(fake_llm(body).url).propose(ctx(), 1)
    assert p.source is None and p.failure.startswith("llm_empty:"), p.failure


def test_garbage_reply_is_recorded_with_tokens(fake_llm):
    [p] = proposer(fake_llm(completion("I like turtles.")).url).propose(ctx(), 1)
    assert p.source is None and p.failure.startswith("bad_reply:"), p.failure
    assert p.raw == "I like turtles." and (p.tokens_in, p.tokens_out) == (11, 7)


def test_truncated_reply_says_so(fake_llm):
    [p] = proposer(fake_llm(completion("```python\nclass ModelNew", finish="length")).url).propose(ctx(), 1)
    assert p.source is None and p.failure.startswith("llm_truncated: reply stopped at max_tokens=4096"), p.failure


def test_diff_reply_becomes_a_source(fake_llm):
    server = fake_llm(completion(DIFF_REPLY))
    [p] = proposer(server.url, max_tokens=321, temperature=0.1).propose(ctx(), 1)
    assert p.failure is None and p.mode == "diff" and p.proposer == "llm"
    assert "e / e.sum(dim=-1, keepdim=True)" in p.source and "torch.softmax" not in p.source
    assert (p.tokens_in, p.tokens_out) == (11, 7) and p.latency_s > 0
    assert p.note == "Compute the softmax by hand so it can become a kernel later."
    [request] = server.requests
    assert (request["model"], request["max_tokens"], request["temperature"]) == ("fake", 321, 0.1)
    system, user = (m["content"] for m in request["messages"])
    assert "<<<<<<< SEARCH" in system and "ModelNew" in system and "triton" in system
    for text in ("rowsoftmax", "torch.softmax(x, dim=-1)", "correct; 1.00x eager", "max abs error 0.5",
                 "unknown name tl.foo", "cpu (Triton interpreter)"):
        assert text in user


def test_n_requests_run_concurrently_with_distinct_seeds(fake_llm):
    server = fake_llm(completion(DIFF_REPLY), delay_s=0.3)
    proposals = proposer(server.url, concurrency=3, seed=7).propose(ctx(), 3)
    assert len(proposals) == 3 and all(p.source for p in proposals)
    assert server.max_in_flight >= 2
    assert sorted(r["seed"] for r in server.requests) == [7, 8, 9]


def test_template_with_unknown_placeholder_fails_at_construction(tmp_path):
    (tmp_path / "system.md").write_text("You write $language kernels.")
    (tmp_path / "user.md").write_text("$task_source")
    with pytest.raises(ApplianceError, match=r"system.md.*language"):
        load_templates(tmp_path)


def test_check_endpoint_against_fake(fake_llm):
    server = fake_llm(completion("OK"))
    assert check_endpoint(LLMSettings(base_url=server.url, model="fake", timeout_s=5)) == []
    [problem] = check_endpoint(LLMSettings(base_url=server.url, model="gpt-9", timeout_s=5))
    assert "'gpt-9' is not served" in problem and "fake" in problem


def test_check_endpoint_without_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    [problem] = check_endpoint(LLMSettings(base_url=f"http://127.0.0.1:{port}/v1", model="m", timeout_s=2))
    assert problem.startswith(f"no vLLM server at http://127.0.0.1:{port}")


# A real vLLM (CPU build, SmolLM2-135M-Instruct): scripts/test_llm_server.sh start prints the URL.
REAL_URL = os.environ.get("APPLIANCE_TEST_LLM_URL")
REAL_MODEL = os.environ.get("APPLIANCE_TEST_LLM_MODEL", "smollm2-135m")
needs_real = pytest.mark.skipif(not REAL_URL, reason="set APPLIANCE_TEST_LLM_URL (scripts/test_llm_server.sh start)")


def real_settings(**kw) -> LLMSettings:
    # 2,048-token window, of which the prompt takes ~820; ~45 tokens/s per request on 2 CPU cores.
    return LLMSettings(**{"base_url": REAL_URL, "model": REAL_MODEL, "max_tokens": 256, "timeout_s": 120,
                          "max_retries": 1, "concurrency": 2, "seed": 0, **kw})


@pytest.mark.llm
@needs_real
def test_real_vllm_proposes():
    proposals = LLMProposer(real_settings()).propose(ctx(), 2)
    assert len(proposals) == 2
    for p in proposals:
        # A 135M model rarely writes a valid kernel: a recorded reply failure is fine, server trouble is not.
        assert (p.source is not None) != (p.failure is not None)
        assert p.failure is None or p.failure.startswith(("bad_reply:", "llm_truncated:")), p.failure
        assert p.tokens_in > 0 and p.tokens_out > 0 and p.raw and p.latency_s > 0


@pytest.mark.llm
@needs_real
def test_real_vllm_check_endpoint():
    assert check_endpoint(real_settings()) == []
    [problem] = check_endpoint(real_settings(model="no-such-model"))
    assert "'no-such-model' is not served" in problem and REAL_MODEL in problem
    [problem] = check_endpoint(real_settings(max_tokens=4096))
    assert "max_tokens=4096 leaves too little" in problem and "2048-token window" in problem


@pytest.mark.llm
@needs_real
def test_real_vllm_rejects_unknown_model():
    [p] = LLMProposer(real_settings(model="no-such-model")).propose(ctx(), 1)
    assert p.source is None and p.failure.startswith("llm_rejected: HTTP 404"), p.failure
    assert "no-such-model" in p.failure


def test_a_prompt_too_long_for_the_window_is_sent_again_without_inspirations_and_history(fake_llm):
    too_long = (400, "This model's maximum context length is 2048 tokens. However, your prompt contains at least "
                     "2049 input tokens.")
    server = fake_llm(too_long, completion(DIFF_REPLY))
    [p] = proposer(server.url).propose(ctx(), 1)
    assert p.source is not None and p.note.startswith("(short prompt: "), (p.failure, p.note)
    full, short = (r["messages"][-1]["content"] for r in server.requests)
    assert "Inspiration 1" in full and "tl.foo" in full
    assert "Inspiration 1" not in short and "tl.foo" not in short and "left out" in short and PARENT.strip() in short
    # Still too long without them: a recorded rejection, never an exception.
    [p] = proposer(fake_llm(too_long).url).propose(ctx(), 1)
    assert p.source is None and p.failure.startswith("llm_rejected: HTTP 400") and "context length" in p.failure


def test_concurrency_bounds_the_requests_of_calls_made_at_once(fake_llm):
    from concurrent.futures import ThreadPoolExecutor

    server = fake_llm(completion(DIFF_REPLY), delay_s=0.3)
    llm = proposer(server.url, concurrency=2)
    with ThreadPoolExecutor(3) as pool:  # as the loop asks for three parents at once, two proposals each
        answers = list(pool.map(lambda _: llm.propose(ctx(), 2), range(3)))
    assert all(p.source for proposals in answers for p in proposals)
    assert len(server.requests) == 6 and server.max_in_flight == 2


def test_the_system_prompt_tells_how_cuda_candidates_build_fast_only_where_cuda_is_allowed():
    from dataclasses import replace

    from appliance.proposers.llm import prompt_fields

    system, _ = load_templates()
    triton_only = system.substitute(prompt_fields(ctx()))
    with_cuda = system.substitute(prompt_fields(replace(ctx(), backends=["triton", "cuda"])))
    assert "cuda_sources" not in triton_only and "temp dir.\n\nDeclare" in triton_only
    assert "cuda_sources" in with_cuda and "includes no torch header" in with_cuda
    assert "the evaluator has precompiled).\n\nDeclare" in with_cuda
