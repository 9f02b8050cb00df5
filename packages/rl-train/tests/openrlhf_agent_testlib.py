"""An agent file written for OpenRLHF (``--agent_func_path``), its base class from rl-envs.

The task of ``rl_envs.verifiers_taskset`` as an OpenRLHF agent: the prompt asks for a digit
(the row's ``answer``); the first character of the reply is scored 1 for that digit, 0.5 for
another, else 0, and the episode ends after one step.
"""

from __future__ import annotations

from typing import Any

import torch
from rl_envs.openrlhf_agent import AgentInstanceBase


class AgentInstance(AgentInstanceBase):
    async def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.step_idx = 0

    async def reset(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        return {"observation": states["observation"]}

    async def step(self, states: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
        first = states["action_text"][:1]
        reward = 1.0 if first == states["label"] else 0.5 if first.isdigit() else 0.0
        return {
            "rewards": torch.tensor([reward]),
            "scores": torch.tensor([reward]),
            "environment_feedback": "",
            "done": True,
            "sampling_params": states.get("sampling_params"),
            "extra_logs": {},
        }
