"""rl-rollout: generation engines with the sampling log-probs the trainer needs.

One :class:`Engine` interface (``generate`` plus weight sync and sleep/wake) with three
implementations: :class:`HFEngine` (Hugging Face ``generate``; CPU or GPU), :class:`VLLMEngine`
(colocated vLLM; ``pip install 'rl-rollout[vllm]'``) and :class:`RemoteEngine` (a client of a
:class:`RolloutServer` serving either). :class:`SamplingParams`, :func:`process_logits` (the
exact processing that was sampled from, for trainer-side recomputation) and
:class:`RolloutResult`. The server also speaks the OpenAI protocol
(:mod:`rl_rollout.openai_api`) and records each episode's calls as token-in/token-out training
rows (:mod:`rl_rollout.openai_trace`). :func:`value_guided_decoding` turns ILQL's heads into a
logits hook (``log_softmax(logits) + beta * (Q - V)``, arXiv 2206.11871).
"""

from importlib.metadata import version as _version

from rl_rollout.decode import lean_decode, supports_lean_decode
from rl_rollout.engine import (
    Engine,
    HFEngine,
    available_engines,
    copy_named_tensors,
    encode_prompts,
    get_engine,
    register_engine,
)
from rl_rollout.openai_api import OpenAIError, OpenAIRoutes
from rl_rollout.openai_trace import TraceCall, TraceRecorder, TraceRow, trace_rows
from rl_rollout.params import LogitsHook, SamplingParams, process_logits
from rl_rollout.result import RolloutResult, assemble_result
from rl_rollout.server import RemoteEngine, RolloutServer, RolloutServerError
from rl_rollout.value_guided import (
    HeadsFn,
    HiddenStateCapture,
    ValueGuidedProcessor,
    value_guided_decoding,
    value_guided_logits,
)
from rl_rollout.vllm_engine import VLLMEngine

__version__: str = _version("rl-rollout")

__all__ = [
    "Engine",
    "HFEngine",
    "HeadsFn",
    "HiddenStateCapture",
    "LogitsHook",
    "OpenAIError",
    "OpenAIRoutes",
    "RemoteEngine",
    "RolloutResult",
    "RolloutServer",
    "RolloutServerError",
    "SamplingParams",
    "TraceCall",
    "TraceRecorder",
    "TraceRow",
    "VLLMEngine",
    "ValueGuidedProcessor",
    "__version__",
    "assemble_result",
    "available_engines",
    "copy_named_tensors",
    "encode_prompts",
    "get_engine",
    "lean_decode",
    "process_logits",
    "register_engine",
    "supports_lean_decode",
    "trace_rows",
    "value_guided_decoding",
    "value_guided_logits",
]
