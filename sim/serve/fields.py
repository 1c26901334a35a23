"""Every OpenAI/vLLM request field and the one answer each backend gives it.

Why a table: a stand-in that silently drops a parameter misleads whoever tests
against it. So every field a request can carry gets exactly one of four
answers, per backend:
- HONOURED: it does what it does on vLLM;
- REJECTED: a 400 naming the field (only when it is set to something other
  than its neutral value, so clients that send every default still work);
- NO_OP: vLLM 0.32 itself accepts it without effect (`best_of`, `user`, and
  any field vLLM does not know: its request models ignore extra fields);
- SCRIPTED: on the simulated backend only, a field about the text, which a
  model-less backend cannot honour (the output follows the workload).
NO_OP and SCRIPTED fields that a request sets are named in the response's
`servesim-ignored` header. docs/serve.md prints this table
(`markdown_table`), so the two cannot drift. The field names are vLLM 0.32's
request models' (tests/fixtures/vllm_request_fields_0.32.0.json).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Answer(Enum):
    HONOURED = "honoured"
    REJECTED = "400"
    NO_OP = "no-op (as vLLM)"
    SCRIPTED = "scripted"


H, R, N, S = Answer.HONOURED, Answer.REJECTED, Answer.NO_OP, Answer.SCRIPTED
BACKENDS = ("simulated", "engine")


@dataclass(frozen=True, slots=True)
class FieldRule:
    """One field: its JSON kind, its neutral values, and each backend's answer."""

    name: str
    kind: str  # "number" | "int" | "bool" | "str" | "list" | "dict" | "any" | "str|list"
    simulated: Answer
    engine: Answer
    neutral: tuple[object, ...] = (None,)
    why: str = ""

    def answer(self, backend: str) -> Answer:
        return self.simulated if backend == "simulated" else self.engine

    def refusal(self, backend: str) -> str:
        """Why `backend` refuses it (a field the simulated backend scripts and the engine
        cannot yet honour says so)."""
        if backend == "engine" and self.simulated is Answer.SCRIPTED:
            return _NOT_ENGINE
        return self.why


_TEXT = "about the text; the simulated backend's output follows the workload"
_NOT_ENGINE = "not served by the engine backend yet"
_LOGPROBS = ("the simulated backend has no model to give log-probabilities: serve with "
             "--engine for them (the model's raw log-probabilities, as vLLM's default)")
_PROMPT_LOGPROBS = "prompt log-probabilities are not served"
_NOT_SERVED = "not served by servesim"

RULES: tuple[FieldRule, ...] = (
    # the request itself, and lengths: both backends honour them
    FieldRule("model", "str", H, H),
    FieldRule("prompt", "any", H, H),
    FieldRule("messages", "list", H, H),
    FieldRule("max_tokens", "int", H, H),
    FieldRule("max_completion_tokens", "int", H, H),
    FieldRule("min_tokens", "int", H, H, (None, 0)),
    FieldRule("ignore_eos", "bool", H, H, (None, False)),
    FieldRule("n", "int", H, H, (None, 1)),
    FieldRule("stream", "bool", H, H, (None, False)),
    FieldRule("stream_options", "dict", H, H, (None, {})),
    FieldRule("seed", "int", H, H, (None,), "simulated: picks where the passage starts"),
    FieldRule("echo", "bool", H, H, (None, False)),
    FieldRule("request_id", "str", H, H, (None, "")),
    FieldRule("priority", "int", R, R, (None, 0),
              "vLLM too refuses a priority without its priority scheduler"),
    FieldRule("use_beam_search", "bool", R, R, (None, False), _NOT_SERVED),
    # sampling: the engine samples from its logits; the simulated backend has none
    FieldRule("temperature", "number", S, H, (None,), _TEXT),
    FieldRule("top_p", "number", S, H, (None, 1, 1.0), _TEXT),
    FieldRule("top_k", "int", S, H, (None, 0, -1), _TEXT),
    FieldRule("stop", "str|list", S, H, (None, "", []), _TEXT),
    FieldRule("stop_token_ids", "list", S, H, (None, []), _TEXT),
    FieldRule("include_stop_str_in_output", "bool", S, H, (None, False), _TEXT),
    FieldRule("min_p", "number", S, R, (None, 0, 0.0), _TEXT),
    FieldRule("presence_penalty", "number", S, H, (None, 0, 0.0), _TEXT),
    FieldRule("frequency_penalty", "number", S, H, (None, 0, 0.0), _TEXT),
    FieldRule("repetition_penalty", "number", S, H, (None, 1, 1.0), _TEXT),
    FieldRule("logit_bias", "dict", S, H, (None, {}), _TEXT),
    FieldRule("bad_words", "list", S, R, (None, []), _TEXT),
    FieldRule("allowed_token_ids", "list", S, R, (None, []), _TEXT),
    FieldRule("length_penalty", "number", N, N, (None, 1, 1.0), "beam search only in vLLM"),
    FieldRule("skip_special_tokens", "bool", S, R, (None, True), _TEXT),
    FieldRule("spaces_between_special_tokens", "bool", S, R, (None, True), _TEXT),
    FieldRule("response_format", "dict", S, R, (None, {"type": "text"}), _TEXT),
    FieldRule("structured_outputs", "dict", S, R, (None,), _TEXT),
    FieldRule("tools", "list", S, R, (None, []), _TEXT),
    FieldRule("tool_choice", "any", S, R, (None, "none", "auto"), _TEXT),
    FieldRule("parallel_tool_calls", "bool", S, R, (None, True, False), _TEXT),
    FieldRule("chat_template", "str", S, R, (None, ""), _TEXT),
    FieldRule("chat_template_kwargs", "dict", S, R, (None, {}), _TEXT),
    FieldRule("add_generation_prompt", "bool", S, R, (None, True), _TEXT),
    FieldRule("continue_final_message", "bool", S, R, (None, False), _TEXT),
    FieldRule("documents", "list", S, R, (None, []), _TEXT),
    FieldRule("include_reasoning", "bool", S, R, (None, True), _TEXT),
    FieldRule("reasoning_effort", "any", S, R, (None,), _TEXT),
    FieldRule("thinking_token_budget", "int", S, R, (None,), _TEXT),
    FieldRule("watermarking", "bool", S, R, (None, False), _TEXT),
    FieldRule("repetition_detection", "any", S, R, (None,), _TEXT),
    FieldRule("suffix", "str", S, R, (None, ""), _TEXT),
    # log-probabilities need a model that returns them
    FieldRule("logprobs", "any", R, H, (None, False), _LOGPROBS),
    FieldRule("top_logprobs", "int", R, H, (None, 0), _LOGPROBS),
    FieldRule("prompt_logprobs", "int", R, R, (None,), _PROMPT_LOGPROBS),
    FieldRule("logprob_token_ids", "list", R, R, (None, []), _NOT_SERVED),
    # no effect on vLLM either
    FieldRule("best_of", "int", N, N, (None,),
              "vLLM 0.32's completion and chat request models have no best_of: it is "
              "accepted and ignored"),
    FieldRule("user", "str", N, N, (None,), "vLLM ignores it"),
    # serving features servesim does not model
    FieldRule("add_special_tokens", "bool", R, R, (None, True, False), _NOT_SERVED),
    FieldRule("truncate_prompt_tokens", "int", R, R, (None,), _NOT_SERVED),
    FieldRule("truncation_side", "str", R, R, (None,), _NOT_SERVED),
    FieldRule("cache_salt", "str", R, R, (None, ""), _NOT_SERVED),
    FieldRule("kv_transfer_params", "dict", R, R, (None, {}), _NOT_SERVED),
    FieldRule("ec_transfer_params", "dict", R, R, (None, {}), _NOT_SERVED),
    FieldRule("session_id", "str", R, R, (None,), _NOT_SERVED),
    FieldRule("vllm_xargs", "dict", R, R, (None, {}), _NOT_SERVED),
    FieldRule("return_token_ids", "bool", R, R, (None, False), _NOT_SERVED),
    FieldRule("return_tokens_as_token_ids", "bool", R, R, (None, False), _NOT_SERVED),
    FieldRule("return_token_offsets", "bool", R, R, (None, False), _NOT_SERVED),
    FieldRule("return_prompt_text", "bool", R, R, (None, False), _NOT_SERVED),
    FieldRule("stream_interval", "int", R, R, (None, 1), _NOT_SERVED),
    FieldRule("routed_experts_prompt_start", "int", R, R, (None, 0), _NOT_SERVED),
    FieldRule("prompt_embeds", "any", R, R, (None,), _NOT_SERVED),
    FieldRule("mm_payload", "any", R, R, (None,), _NOT_SERVED),
    FieldRule("mm_processor_kwargs", "dict", R, R, (None, {}), _NOT_SERVED),
    FieldRule("media_io_kwargs", "dict", R, R, (None, {}), _NOT_SERVED),
    FieldRule("return_mm_kwargs", "bool", R, R, (None, False), _NOT_SERVED),
)
BY_NAME = {rule.name: rule for rule in RULES}
UNKNOWN = FieldRule("(any other field)", "any", N, N, (),
                    "vLLM's request models accept unknown fields and ignore them")

_KINDS: dict[str, tuple[type, ...]] = {
    "number": (int, float), "int": (int,), "bool": (bool,), "str": (str,), "list": (list,),
    "dict": (dict,), "str|list": (str, list)}


def _same(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return a == b


def is_neutral(rule: FieldRule, value: object) -> bool:
    """True when `value` asks for nothing (None or the field's default): never refused,
    never listed as ignored."""
    return any(_same(value, n) for n in rule.neutral)


def kind_ok(rule: FieldRule, value: object) -> bool:
    """The JSON type check vLLM's request models make (bool is not a number here)."""
    if value is None or rule.kind == "any":
        return True
    if isinstance(value, bool) and rule.kind != "bool":
        return False
    return isinstance(value, _KINDS[rule.kind])


def markdown_table() -> str:
    """The table docs/serve.md shows (tests/test_serve_fields.py keeps them equal)."""
    lines = ["| field | simulated | engine | note |", "| --- | --- | --- | --- |"]
    for rule in (*RULES, UNKNOWN):
        lines.append(f"| `{rule.name}` | {rule.simulated.value} | {rule.engine.value} | "
                     f"{rule.why} |")
    return "\n".join(lines)
