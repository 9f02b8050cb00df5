"""The client of an OpenRLHF remote reward model (``--remote_rm_url http://host:port/get_reward``).

OpenRLHF's reward servers (``openrlhf.cli.serve_rm`` and the ones users write after it) answer
``POST <endpoint>`` ``{"query": [str] (N), "prompts": [str] (N), "labels": [...] (N)}`` with
``{"rewards": [float] (N), ...}`` (often ``"scores"`` and ``"extra_logs"`` too), ``query``
being each prompt and completion as one text. :class:`OpenRLHFRemoteReward` sends that request
and is itself an OpenRLHF-style ``reward_func(queries, prompts, labels)``, so
:class:`~rl_envs.ReasoningGym` calls it with OpenRLHF's arguments
(:mod:`rl_envs.reward_functions`) and reads its ``"rewards"``. Time budget, retries and errors
are :class:`~rl_envs.remote_reward.RemoteReward`'s.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

from rl_envs.remote_reward import RemoteReward, RewardServerError

__all__ = ["OpenRLHFRemoteReward"]


class OpenRLHFRemoteReward(RemoteReward):
    """An OpenRLHF reward server as ``reward_func(queries, prompts, labels) -> dict``.

    Args:
        url: The endpoint, ``http://host:port/path`` (OpenRLHF's ``--remote_rm_url``, e.g.
            ``http://10.0.0.7:5000/get_reward``).
        **kwargs: ``timeout``, ``retries``, ``backoff``, ``connect_timeout`` as for
            :class:`~rl_envs.remote_reward.RemoteReward`.
    """

    __name__ = "openrlhf_remote_reward"

    def __init__(self, url: str, **kwargs: Any) -> None:
        parts = urlsplit(url)
        if parts.path in ("", "/"):
            raise ValueError(
                f"`url` {url!r} names no endpoint: OpenRLHF reward servers answer on a path, "
                "e.g. http://host:5000/get_reward"
            )
        super().__init__(f"{parts.scheme}://{parts.netloc}", **kwargs)
        self.endpoint = parts.path + (f"?{parts.query}" if parts.query else "")

    def __repr__(self) -> str:
        return (
            f"OpenRLHFRemoteReward({self.url + self.endpoint!r}, timeout={self.timeout}, "
            f"retries={self.retries})"
        )

    def __call__(  # type: ignore[override]
        self, queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any]
    ) -> dict[str, Any]:
        """The server's answer for N samples: a dict with ``"rewards"`` (N numbers).

        Raises:
            RewardServerError: The server is down, silent past ``timeout``, failed, or answered
                without N ``"rewards"``.
            ValueError: The samples cannot be sent as JSON, or the server refused them (400).
        """
        if not len(queries) == len(prompts) == len(labels):
            raise ValueError(
                f"`queries`, `prompts` and `labels` must have one entry per sample, got "
                f"{len(queries)}, {len(prompts)} and {len(labels)}"
            )
        try:
            body = json.dumps(
                {"query": list(queries), "prompts": list(prompts), "labels": list(labels)}
            ).encode()
        except (TypeError, ValueError) as exc:
            raise ValueError(f"the samples cannot be sent as JSON: {exc}") from exc
        payload = self._call(self.endpoint, body)
        rewards = payload.get("rewards")
        if not isinstance(rewards, list) or len(rewards) != len(queries):
            raise RewardServerError(
                f"{self.url}{self.endpoint} answered {str(payload)[:200]}; expected "
                f"{{'rewards': [...]}} with {len(queries)} entries (OpenRLHF's reward server)"
            )
        return payload

    def score(self, *args: Any, **kwargs: Any) -> list[float | None]:
        """Not available: OpenRLHF's servers take ``queries``; call the object instead."""
        raise NotImplementedError(
            "OpenRLHFRemoteReward speaks OpenRLHF's protocol: call it as "
            "reward(queries, prompts, labels)"
        )

    def health(self) -> dict[str, Any]:
        """Not available: OpenRLHF's reward servers have no health route."""
        raise NotImplementedError("OpenRLHF reward servers have no health route")
