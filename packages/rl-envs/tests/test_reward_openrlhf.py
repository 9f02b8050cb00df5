"""OpenRLHF's ``reward_func(queries, prompts, labels)``, called as OpenRLHF calls it.

OpenRLHF decodes each sequence (prompt and completion ids) with the special tokens kept and
passes those ``queries``, the rendered ``prompts`` and the ``--label_key`` column as
``labels``, positionally; it reads a returned tensor, or a dict's ``"rewards"``.
"""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch
from datasets import Dataset
from envs_testlib import encode, tok
from rl_envs import ReasoningGym, detect_reward_style
from rl_envs.reward_functions import RewardSamples, score_samples

EOS = 2
ROWS = [
    {"prompt": [{"role": "user", "content": f"add one to {i}"}], "ground_truth": str(i + 1)}
    for i in range(4)
]


def gym(reward_fn: Any) -> ReasoningGym:
    data = Dataset.from_list(ROWS)
    return ReasoningGym(data, data, tok(), reward_fn, data_batch_size_per_gpu=2, shuffle=False,
                        answer_column="ground_truth")  # fmt: skip


def completions(batch: Any, texts: list[list[str]]) -> list[torch.Tensor]:
    """``[G, P + T]`` rows as get_action returns them: prompt, completion, EOS, pad 0."""
    out = []
    for prompt, group in zip(batch, texts, strict=True):
        rows = [prompt["input_ids"][0].tolist() + encode(t) + [EOS] for t in group]
        width = max(map(len, rows)) + 2
        out.append(torch.tensor([r + [0] * (width - len(r)) for r in rows]))
    return out


def test_the_reward_func_gets_openrlhfs_queries_prompts_and_labels() -> None:
    seen: list[tuple[Any, ...]] = []

    def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> torch.Tensor:
        seen.append((queries, prompts, labels))
        return torch.tensor([float(q.removesuffix("<eos>").endswith(a)) for q, a in
                             zip(queries, labels, strict=True)])  # fmt: skip

    assert detect_reward_style(reward_func) == "openrlhf"
    env = gym(reward_func)
    batch = env.reset()
    _, rewards = env.step(completions(batch, [["1", "7"], ["3", "2"]]))
    # bit-exact: rewards are 0/1, exact in float32
    assert rewards.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    [(queries, prompts, labels)] = seen
    assert prompts == [batch[0]["text"]] * 2 + [batch[1]["text"]] * 2  # rendered, G times each
    assert queries[1] == batch[0]["text"] + "7<eos>"  # special tokens kept, padding not
    assert queries == [
        tok().decode([*batch[n // 2]["input_ids"][0].tolist(), *encode(t), EOS])
        for n, t in enumerate(["1", "7", "3", "2"])
    ]
    assert labels == ["1", "1", "2", "2"]


def test_a_dict_gives_its_rewards_and_names_what_it_leaves() -> None:
    def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> Any:
        return {"rewards": torch.arange(4.0), "scores": torch.ones(4), "extra_logs": {}}

    env = gym(reward_func)
    env.reset()
    with pytest.warns(UserWarning, match=r"reward_func returned \['extra_logs', 'scores'\] next to 'rewards': only 'rewards' is used"):  # fmt: skip
        _, rewards = env.step([["a", "b"], ["c", "d"]])
    # bit-exact: small integers, exact in float32
    assert rewards.tolist() == [[0.0, 1.0], [2.0, 3.0]]

    def rewards_only(queries: list[str], prompts: list[str], labels: list[str]) -> Any:
        return {"rewards": [0.5] * len(queries)}

    env = gym(rewards_only)
    env.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _, rewards = env.step([["a", "b"], ["c", "d"]])
    assert rewards.tolist() == [[0.5, 0.5], [0.5, 0.5]]  # bit-exact: 0.5 is exact


def test_async_reward_funcs_are_awaited() -> None:
    async def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> Any:
        return {"rewards": [float(len(q)) for q in queries]}

    env = gym(reward_func)
    batch = env.reset()
    _, rewards = env.step([["a", "bc"], ["", "d"]])
    # string completions are tokenised as they are: no EOS in the query
    lengths = [len(batch[n // 2]["text"]) + k for n, k in enumerate([1, 2, 0, 1])]
    # bit-exact: small integers, exact in float32
    assert rewards.flatten().tolist() == [float(x) for x in lengths]


@pytest.mark.parametrize(
    ("value", "match"),
    [
        ({"scores": [1.0] * 4}, r"returned a dict without 'rewards' \(keys \['scores'\]\)"),
        (torch.zeros(3), r"returned 3 values for 4 samples"),
        ([1.0, float("nan"), 0.0, 0.0], r"returned nan for sample 1"),
    ],
)
def test_bad_returns_name_the_function(value: Any, match: str) -> None:
    def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> Any:
        return value

    env = gym(reward_func)
    env.reset()
    with pytest.raises(ValueError, match=match):
        env.step([["a", "b"], ["c", "d"]])


def test_samples_without_queries_are_refused_naming_the_fields() -> None:
    def reward_func(queries: list[str], prompts: list[str], labels: list[str]) -> Any:
        return [0.0] * len(queries)

    samples = RewardSamples(group_size=1, prompts=["p"], completions=["c"],
                            completion_ids=[[5]], columns={}, answers=["a"],
                            questions=["q"])  # fmt: skip
    with pytest.raises(ValueError, match=r"needs the samples' token-decoded `queries` and `prompt_texts`"):  # fmt: skip
        score_samples([reward_func], [1.0], ["openrlhf"], samples)
    full = RewardSamples(group_size=1, prompts=["p"], completions=["c"], completion_ids=[[5]],
                         columns={}, answers=["a"], questions=["q"], prompt_texts=["p"],
                         queries=["pc"])  # fmt: skip
    # bit-exact: 0.0
    assert score_samples([reward_func], [1.0], ["openrlhf"], full).total.tolist() == [0.0]
