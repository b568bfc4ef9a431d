"""The LLM proposer: asks an OpenAI-compatible server (vLLM on GPU 0) for new candidates.

Each of the n proposals is its own chat-completion request, sent concurrently. Server trouble (down, hung, HTTP errors,
empty replies) and unusable replies become Proposals with `failure` set, never exceptions: a run outlives its LLM
server's restarts and records what went wrong."""

from __future__ import annotations

import itertools
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from string import Template

import openai

from appliance.errors import ApplianceError
from appliance.proposers import edits
from appliance.proposers.base import Example, PromptContext, Proposal, Traits
from appliance.proposers.untrusted import fence_feedback

PROMPTS = Path(__file__).parent / "prompts"
LEFT_OUT = "(left out: the whole prompt did not fit the model's context window)"
FIELDS = ("task_name", "task_source", "shapes", "device", "backends", "backend_notes", "parent_label",
          "parent_source", "parent_feedback", "inspirations", "history")
# Per allowed backend, what makes its candidates cheap to evaluate. CUDA: nvcc's pass over torch's headers is most of
# a load_inline build (68 s a build, 8 at once on 16 cores, H100); the C++ file gets torch's headers precompiled by
# the evaluator (sandbox/builds.py), a .cu file cannot.
BACKEND_NOTES = {
    "cuda": "CUDA kernels built with torch.utils.cpp_extension.load_inline build much faster when the CUDA source "
            "(cuda_sources) includes no torch header: pass no_implicit_headers=True, include only <cuda_runtime.h> "
            "and the like there, with a plain launcher function taking raw pointers and sizes; put the "
            "torch::Tensor wrapper that calls it in cpp_sources, starting with #include <torch/extension.h> (which "
            "the evaluator has precompiled).",
}


@dataclass
class LLMSettings:
    base_url: str = "http://127.0.0.1:8000/v1"
    model: str = ""  # vLLM's --served-model-name
    api_key: str = "EMPTY"  # vLLM checks it only when started with --api-key; the client insists on one
    max_tokens: int = 4096
    temperature: float = 0.8
    timeout_s: float = 300.0  # per attempt; a CPU-served or busy model is slow
    max_retries: int = 2  # the client retries timeouts, dropped connections, 408/409/429/5xx with backoff
    concurrency: int = 4
    templates_dir: Path | None = None  # None: the bundled prompts/
    seed: int | None = None  # request i of the run gets seed + i: reproducible, yet n proposals differ


class LLMProposer:
    name = "llm"
    traits = Traits(reads_profiles=True)  # the prompt carries the Nsight Compute summary (search/database.py)

    def __init__(self, settings: LLMSettings, name: str = "llm"):
        self.name = name  # "llm", or "llm:PROFILE" when a run mixes several models (proposers/mix.py)
        self.settings = settings
        self.client = _client(settings)
        self.system, self.user = load_templates(settings.templates_dir)
        self._requests = itertools.count()
        # The loop asks for several parents at once, each with n requests: `concurrency` bounds them all together.
        self._in_flight = threading.BoundedSemaphore(max(1, settings.concurrency))

    def accepts(self, parent_source: str) -> bool:
        return True  # any parent, even one that failed the gate (its verdict is in the prompt)

    def propose(self, ctx: PromptContext, n: int, seen: set[str] | None = None) -> list[Proposal]:
        prompts = [self._messages(prompt_fields(ctx))]
        if ctx.inspirations or ctx.history:  # what to send when the whole prompt does not fit the model's window
            prompts.append(self._messages(prompt_fields(ctx) | {"inspirations": LEFT_OUT, "history": LEFT_OUT}))
        seeds = [None if self.settings.seed is None else self.settings.seed + next(self._requests) for _ in range(n)]
        with ThreadPoolExecutor(max_workers=max(1, min(self.settings.concurrency, n))) as pool:
            return list(pool.map(lambda seed: self._one(ctx.parent.source, prompts, seed), seeds))

    def _messages(self, fields: dict[str, str]) -> list[dict]:
        return [{"role": "system", "content": self.system.substitute(fields)},
                {"role": "user", "content": self.user.substitute(fields)}]

    def _one(self, parent_source: str, prompts: list[list[dict]], seed: int | None) -> Proposal:
        s = self.settings
        start = time.perf_counter()
        for i, messages in enumerate(prompts):
            try:
                with self._in_flight:
                    reply = self.client.chat.completions.create(model=s.model, messages=messages,
                                                                max_tokens=s.max_tokens, temperature=s.temperature,
                                                                seed=seed)
                break
            except openai.BadRequestError as e:
                if i + 1 < len(prompts) and "context length" in str(e.message).lower():
                    continue  # too long for the model's window: again without inspirations and history
                return Proposal(None, self.name, failure=describe_error(e, s), latency_s=time.perf_counter() - start,
                                kind="endpoint")
            except openai.OpenAIError as e:
                return Proposal(None, self.name, failure=describe_error(e, s), latency_s=time.perf_counter() - start,
                                kind="endpoint")
        latency = time.perf_counter() - start
        usage = getattr(reply, "usage", None)
        proposal = Proposal(None, self.name, latency_s=latency, tokens_in=getattr(usage, "prompt_tokens", 0) or 0,
                            tokens_out=getattr(usage, "completion_tokens", 0) or 0)
        choices = getattr(reply, "choices", None)  # a server can answer 200 with JSON that is no completion
        if not choices:
            proposal.failure, proposal.kind = "llm_empty: the server answered without choices", "model_output"
            return proposal
        text = choices[0].message.content or ""
        proposal.raw = text
        try:
            proposal.source, proposal.mode = edits.apply_reply(parent_source, text)
        except edits.EditError as e:
            proposal.kind = "model_output"
            if choices[0].finish_reason == "length":  # the operator's fix differs: raise max_tokens
                proposal.failure = f"llm_truncated: reply stopped at max_tokens={s.max_tokens}: {e}"
            else:
                proposal.failure = f"bad_reply: {e}"
            return proposal
        proposal.note = _summary(text)
        if messages is not prompts[0]:
            proposal.note = f"(short prompt: the whole one did not fit {s.model}'s window) {proposal.note}"
        return proposal


def describe_error(e: openai.OpenAIError, s: LLMSettings) -> str:
    tries = f"{s.max_retries + 1} attempt(s)"
    if isinstance(e, openai.APITimeoutError):
        return f"llm_timeout: no reply within {s.timeout_s:g} s from {s.base_url} ({tries})"
    if isinstance(e, openai.APIConnectionError):
        cause = e.__cause__ or e
        return f"llm_unreachable: {s.base_url}: {type(cause).__name__}: {cause} ({tries}); is the vLLM server up?"
    if isinstance(e, openai.APIStatusError):
        kind = "llm_server_error" if e.status_code >= 500 else "llm_rejected"
        return f"{kind}: HTTP {e.status_code} from {s.base_url}: {_short(e.message)}"
    return f"llm_error: {type(e).__name__}: {_short(str(e))}"


def load_templates(folder: Path | None = None) -> tuple[Template, Template]:
    """The system and user prompt templates; a placeholder we do not fill is a configuration error, found here
    rather than on the first request."""
    folder = Path(folder) if folder else PROMPTS
    templates = []
    for name in ("system.md", "user.md"):
        path = folder / name
        template = Template(path.read_text())
        try:
            template.substitute({f: "" for f in FIELDS})
        except (KeyError, ValueError) as e:
            raise ApplianceError(f"{path}: unknown or malformed placeholder {e}; known: "
                                 + ", ".join(f"${f}" for f in FIELDS)) from None
        templates.append(template)
    return templates[0], templates[1]


def prompt_fields(ctx: PromptContext) -> dict[str, str]:
    """The templates' fields. What candidates and models wrote into the evaluator's feedback (reasons, tracebacks,
    stderr, proposal failures) is fenced as untrusted output (untrusted.py); the system prompt says what that means."""
    return {
        "task_name": ctx.task_name,
        "task_source": ctx.task_source.strip(),
        "shapes": "\n".join(f"- {line}" for line in ctx.shapes) or "- main: the task file's own sizes",
        "device": ctx.device,
        "backends": ", ".join(ctx.backends),
        "backend_notes": "".join(BACKEND_NOTES[b] + "\n" for b in ctx.backends if b in BACKEND_NOTES),
        "parent_label": ctx.parent.label or "parent",
        "parent_source": ctx.parent.source.strip(),
        "parent_feedback": fence_feedback(ctx.parent.feedback) or "(not evaluated yet)",
        "inspirations": "\n\n".join(_example(i, ex) for i, ex in enumerate(ctx.inspirations, 1)) or "(none yet)",
        "history": "\n".join("- " + fence_feedback(line).replace("\n", "\n  ") for line in ctx.history)
                   or "(none yet)",
    }


def _example(i: int, ex: Example) -> str:
    title = f"### Inspiration {i}" + (f" ({ex.label})" if ex.label else "")
    return (f"{title}\n```python\n{ex.source.strip()}\n```\n"
            f"Evaluator: {fence_feedback(ex.feedback) or '(no feedback)'}")


def _summary(text: str) -> str:
    """The model's explanation: what it wrote before its first edit block or code fence."""
    cut = min((i for i in (text.find("<<<<<<<"), text.find("```")) if i >= 0), default=len(text))
    return _short(text[:cut].strip(), 500)


def _short(text: str, limit: int = 300) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _client(s: LLMSettings, max_retries: int | None = None) -> openai.OpenAI:
    return openai.OpenAI(base_url=s.base_url, api_key=s.api_key, timeout=s.timeout_s,
                         max_retries=s.max_retries if max_retries is None else max_retries)


def check_endpoint(s: LLMSettings) -> list[str]:
    """What stops the proposer from working with these settings, each with how to fix it; empty when all is well."""
    root = s.base_url.rstrip("/").removesuffix("/v1")
    try:
        with urllib.request.urlopen(f"{root}/health", timeout=min(s.timeout_s, 10)) as r:
            r.read()
    except OSError as e:  # URLError, HTTPError, refused, timeout
        reason = getattr(e, "reason", None) or e
        return [f"no vLLM server at {root} ({root}/health: {reason}): start it (`appliance model serve PROFILE`), or "
                f"set APPLIANCE_LLM_URL (now {s.base_url}) to where it listens"]
    client = _client(s, max_retries=0)
    try:
        served = {m.id: m for m in client.models.list()}
    except openai.OpenAIError as e:
        return [f"{s.base_url}/models failed ({describe_error(e, s)}): APPLIANCE_LLM_URL, vLLM's OpenAI API, ends in /v1"]
    if s.model not in served:
        return [f"model {s.model!r} is not served at {s.base_url} (served: {', '.join(served) or 'none'}): set "
                f"APPLIANCE_LLM_MODEL to one of those, or start vLLM with --served-model-name {s.model}"]
    window = getattr(served[s.model], "max_model_len", None)  # a vLLM extra; prompt + reply must fit in it
    if window and s.max_tokens > window // 2:
        return [f"max_tokens={s.max_tokens} leaves too little of {s.model}'s {window}-token window for the prompt: "
                f"lower APPLIANCE_LLM_MAX_TOKENS (or the profile's max_tokens), or start vLLM with a larger "
                f"--max-model-len"]
    try:
        reply = client.chat.completions.create(model=s.model, messages=[{"role": "user", "content": "Say OK."}],
                                               max_tokens=1, temperature=0)
    except openai.OpenAIError as e:
        return [f"a 1-token chat completion failed ({describe_error(e, s)}); see the vLLM server's log"]
    if not getattr(reply, "choices", None):
        return [f"a 1-token chat completion returned no choices from {s.base_url}; see the vLLM server's log"]
    return []
