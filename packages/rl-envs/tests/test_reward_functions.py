"""TRL-style prompt datasets and the AgileRL / TRL / verl reward conventions in ReasoningGym."""

from __future__ import annotations

import asyncio
import math
import threading
from typing import Any

import pytest
import torch
from datasets import Dataset
from envs_testlib import TEMPLATE, encode, qa_dataset, tok
from rl_envs import ReasoningGym, RewardFunctionError, detect_reward_style, verl_reward
from rl_envs.reward_functions import RewardSamples, resolve_reward_styles, score_samples
from rl_testing.tokenizer import char_tokenizer

EOS = 2


def chat_rows(n: int) -> list[dict[str, Any]]:
    """TRL conversational rows: a ``prompt`` of messages plus two extra columns."""
    return [
        {
            "prompt": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": f"add one to {i}"},
            ],
            "ground_truth": str(i + 1),
            "level": i % 3,
        }
        for i in range(n)
    ]


def prompt_gym(
    rows: list[dict[str, Any]], reward_fn: Any, batch: int = 2, **kw: Any
) -> ReasoningGym:
    data = Dataset.from_list(rows)
    kw.setdefault("shuffle", False)
    return ReasoningGym(data, data, kw.pop("tokenizer", tok()), reward_fn,
                        data_batch_size_per_gpu=batch, **kw)  # fmt: skip


def token_completions(batch: Any, texts: list[list[str]]) -> list[torch.Tensor]:
    """``[G, P + T]`` rows: prompt, completion, EOS, then pad 0 (what get_action returns)."""
    out = []
    for prompt, group in zip(batch, texts, strict=True):
        rows = [prompt["input_ids"][0].tolist() + encode(t) + [EOS] for t in group]
        width = max(map(len, rows)) + 3
        out.append(torch.tensor([r + [0] * (width - len(r)) for r in rows]))
    return out


# -- style detection ------------------------------------------------------------------------------


def test_styles_are_read_from_the_signature() -> None:
    def trl(completions: list[str], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    def trl_named(
        prompts: list[Any], completions: list[Any], ground_truth: list[str]
    ) -> list[float]:
        return []

    def only_kwargs(**kwargs: Any) -> list[float]:
        return []

    def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:  # fmt: skip
        return 0.0

    def agilerl(completion: str, answer: str, question: str) -> float:
        return 0.0

    assert detect_reward_style(trl) == "trl"
    assert detect_reward_style(trl_named) == "trl"
    assert detect_reward_style(only_kwargs) == "trl"
    assert detect_reward_style(compute_score) == "verl"
    assert detect_reward_style(agilerl) == "agilerl"
    assert detect_reward_style(lambda c, a, q: 0.0) == "agilerl"
    assert detect_reward_style(max) == "agilerl"  # no readable signature: the old convention
    assert resolve_reward_styles([trl, agilerl], None) == ["trl", "agilerl"]
    assert resolve_reward_styles([trl, agilerl], ["auto", "trl"]) == ["trl", "trl"]
    with pytest.raises(ValueError, match=r"`reward_style` 'openai' for agilerl is unknown"):
        resolve_reward_styles([agilerl], "openai")
    with pytest.raises(ValueError, match="`reward_style` has 1 entries for 2 reward functions"):
        resolve_reward_styles([trl, agilerl], ["trl"])


# -- prompt datasets ------------------------------------------------------------------------------


def test_conversational_prompts_use_the_chat_template_and_trl_gets_messages() -> None:
    seen: dict[str, Any] = {}

    def reward(prompts: list[Any], completions: list[Any], completion_ids: list[list[int]], **kwargs: Any) -> list[float]:  # fmt: skip
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, kwargs=kwargs)
        return [float(c[0]["content"] == gt) for c, gt in zip(completions, kwargs["ground_truth"], strict=True)]  # fmt: skip

    env = prompt_gym(chat_rows(4), reward)
    batch = env.reset()
    assert batch[0]["text"] == "<|system|>be brief<eos><|user|>add one to 0<eos><|assistant|>"
    assert batch[0]["question"] == "add one to 0"  # the last message, for AgileRL-style rewards
    _, rewards = env.step(token_completions(batch, [["1", "7"], ["3", "2"]]))
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert rewards.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert seen["prompts"][0] == seen["prompts"][1] == chat_rows(1)[0]["prompt"]  # repeated G times
    assert seen["completions"][1] == [{"role": "assistant", "content": "7"}]
    assert seen["ids"] == [[*encode(t), EOS] for t in ["1", "7", "3", "2"]]  # no padding
    assert seen["kwargs"] == {"ground_truth": ["1", "1", "2", "2"], "level": [0, 0, 1, 1]}


def test_plain_text_prompts_are_used_as_they_are_and_completions_stay_strings() -> None:
    got: list[Any] = []

    def reward(completions: list[Any], **kwargs: Any) -> list[float]:
        got.extend(completions)
        return [float(len(c)) for c in completions]

    rows = [{"prompt": f"count {i}:", "answer": str(i)} for i in range(4)]
    env = prompt_gym(rows, reward)  # the tokenizer has a chat template: it is not applied
    batch = env.reset()
    assert [p["text"] for p in batch] == ["count 0:", "count 1:"]
    assert batch.answers == ["0", "1"]
    _, rewards = env.step([["ab", "abc"], ["", "a"]])
    assert got == ["ab", "abc", "", "a"]
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert rewards.tolist() == [[2.0, 3.0], [0.0, 1.0]]


def test_agilerl_rewards_work_on_prompt_data_with_an_answer_column() -> None:
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}], "answer": f"a{i}"} for i in range(4)]
    calls: list[tuple[str, str, str]] = []

    def agilerl(completion: str, answer: str, question: str) -> float:
        calls.append((completion, answer, question))
        return float(completion == answer)

    env = prompt_gym(rows, agilerl)
    env.reset()
    _, rewards = env.step([["a0", "x"], ["y", "a1"]])
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert rewards.tolist() == [[1.0, 0.0], [0.0, 1.0]]
    assert calls[0] == ("a0", "a0", "q0")


def test_prompt_data_errors_name_the_fix() -> None:
    def trl(completions: list[Any], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    no_template = char_tokenizer()
    no_template.chat_template = None
    with pytest.raises(ValueError, match=r"row 0 of the train dataset is a conversation but the tokenizer has no chat template: set tokenizer.chat_template"):  # fmt: skip
        prompt_gym(chat_rows(4), trl, tokenizer=no_template)
    with pytest.raises(ValueError, match=r"has no 'prompt' column; its columns are \['question', 'answer'\]\. Pass prompt_column="):  # fmt: skip
        ReasoningGym(qa_dataset(4), qa_dataset(2), tok(), trl)
    with pytest.raises(ValueError, match=r"takes AgileRL's \(completion, answer, question\) but the train dataset has no 'answer' column"):  # fmt: skip
        prompt_gym(chat_rows(4), lambda c, a, q: 0.0)
    with pytest.raises(ValueError, match=r"the prompt of row 0 of the train dataset must be a string or a list"):  # fmt: skip
        prompt_gym([{"prompt": [1, 2]}, {"prompt": [3]}], trl)
    with pytest.raises(ValueError, match="pass conversation_template=None"):
        ReasoningGym(Dataset.from_list(chat_rows(4)), Dataset.from_list(chat_rows(2)), tok(), trl, TEMPLATE)  # fmt: skip


def test_question_answer_data_gives_trl_functions_every_column() -> None:
    seen: dict[str, Any] = {}

    def reward(prompts: list[Any], completions: list[Any], **kwargs: Any) -> list[float]:
        seen.update(prompts=prompts, completions=completions, kwargs=kwargs)
        return [1.0] * len(completions)

    env = ReasoningGym(qa_dataset(4), qa_dataset(2), tok(), reward, TEMPLATE, 2, shuffle=False)
    batch = env.reset()
    env.step([["x"], ["y"]])
    assert seen["prompts"] == [p["text"] for p in batch]  # the rendered template, as text
    assert seen["completions"] == ["x", "y"]
    assert seen["kwargs"] == {
        "question": ["q0", "q1"],
        "answer": ["a0", "a1"],
        "completion_ids": [encode("x"), encode("y")],
    }


# -- combining: weights and None ------------------------------------------------------------------


def samples(n: int, group: int = 2) -> RewardSamples:
    return RewardSamples(
        group_size=group,
        prompts=[f"p{i // group}" for i in range(n)],
        completions=[f"c{i}" for i in range(n)],
        completion_ids=[[5 + i] for i in range(n)],
        columns={"k": list(range(n))},
        answers=["a"] * n,
        questions=["q"] * n,
    )


def test_none_is_left_out_of_the_weighted_sum_and_all_none_gives_zero_with_a_warning() -> None:
    def first(completions: list[str], **kwargs: Any) -> list[float | None]:
        return [1.0, None, 2.0, None]

    def second(completions: list[str], **kwargs: Any) -> list[float | None]:
        return [None, 10.0, 4.0, None]

    with pytest.warns(UserWarning, match=r"returned None for 1 of 4 samples \(sample 3 \(prompt 1, completion 1\) first\): their reward is 0"):  # fmt: skip
        scores = score_samples([first, second], [2.0, 0.5], ["trl", "trl"], samples(4))
    # hand computation: 2*1; 0.5*10; 2*2 + 0.5*4; nothing
    assert scores.total.tolist() == [2.0, 5.0, 6.0, 0.0]
    assert scores.not_applicable == [3]
    first_values = scores.components["first"].tolist()
    assert first_values[0] == 1.0 and math.isnan(first_values[1])


def test_env_rewards_use_the_weights_and_components_mark_none_as_nan() -> None:
    def length(completions: list[str], **kwargs: Any) -> list[float]:
        return [float(len(c)) for c in completions]

    def only_even(completions: list[str], level: list[int], **kwargs: Any) -> list[float | None]:
        return [1.0 if lv % 2 == 0 else None for lv in level]

    rows = [{"prompt": "p", "level": i} for i in range(4)]
    env = prompt_gym(rows, [length, only_even], reward_weights=[1.0, 10.0])
    env.reset()
    _, rewards = env.step([["aa", "a"], ["aaa", ""]])
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert rewards.tolist() == [[12.0, 11.0], [3.0, 0.0]]  # row 1 (level 1): only the length
    assert torch.isnan(env.last_reward_components["only_even"][1]).all()


# -- async ----------------------------------------------------------------------------------------


def handshake_pair() -> tuple[Any, Any]:
    """Two async reward functions that each wait for the other: sequential calls would time out."""
    ping, pong = asyncio.Event(), asyncio.Event()

    async def ask(completions: list[str], **kwargs: Any) -> list[float]:
        ping.set()
        await asyncio.wait_for(pong.wait(), timeout=10)
        return [1.0] * len(completions)

    async def answer(completions: list[str], **kwargs: Any) -> list[float]:
        await asyncio.wait_for(ping.wait(), timeout=10)
        pong.set()
        return [2.0] * len(completions)

    return ask, answer


def test_async_reward_functions_run_concurrently() -> None:
    ask, answer = handshake_pair()
    env = prompt_gym([{"prompt": "p"}] * 4, [answer, ask])  # the waiting one first
    env.reset()
    _, rewards = env.step([["a", "b"], ["c", "d"]])
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert rewards.tolist() == [[3.0, 3.0], [3.0, 3.0]]


def test_async_rewards_work_from_inside_a_running_event_loop() -> None:
    ask, answer = handshake_pair()
    env = prompt_gym([{"prompt": "p"}] * 4, [ask, answer])
    env.reset()

    async def main() -> torch.Tensor:  # e.g. a notebook: a loop is running in this thread
        return env.step([["a", "b"], ["c", "d"]])[1]

    assert asyncio.run(main()).tolist() == [[3.0, 3.0], [3.0, 3.0]]


def test_per_sample_async_functions_are_gathered_too() -> None:
    async def agilerl(completion: str, answer: str, question: str) -> float:
        await asyncio.sleep(0)
        return float(len(completion))

    scores = score_samples([agilerl], [1.0], ["agilerl"], samples(4))
    assert scores.total.tolist() == [2.0, 2.0, 2.0, 2.0]


# -- wrong returns and raising functions ----------------------------------------------------------


@pytest.mark.parametrize(
    ("out", "match"),
    [
        (
            [1.0, 2.0, 3.0],
            r"reward function bad returned 3 values for 4 samples \(2 prompts x 2 completions\)",
        ),
        (1.0, r"reward function bad returned a float; it must return a list of 4 floats"),
        ("1111", r"reward function bad returned a str"),
        (
            [1.0, "x", 0.0, 0.0],
            r"reward function bad returned 'x' for sample 1 \(prompt 0, completion 1\); each value must be a finite number or None\. Completion: 'c1'",
        ),
        ([1.0, 0.0, math.nan, 0.0], r"returned nan for sample 2 \(prompt 1, completion 0\)"),
        ([1.0, 0.0, 0.0, -math.inf], r"returned -inf for sample 3 \(prompt 1, completion 1\)"),
    ],
)
def test_a_wrong_return_names_the_function_and_the_sample(out: Any, match: str) -> None:
    def bad(completions: list[str], **kwargs: Any) -> Any:
        return out

    with pytest.raises(ValueError, match=match):
        score_samples([bad], [1.0], ["trl"], samples(4))


def test_a_wrong_async_return_and_tensors() -> None:
    async def bad(completions: list[str], **kwargs: Any) -> Any:
        return [None, None, math.inf, None]

    def tensor(completions: list[str], **kwargs: Any) -> torch.Tensor:
        return torch.arange(4.0)

    with pytest.raises(ValueError, match=r"reward function bad returned inf for sample 2"):
        score_samples([bad], [1.0], ["trl"], samples(4))
    assert score_samples([tensor], [1.0], ["trl"], samples(4)).total.tolist() == [0, 1, 2, 3]


def test_raising_functions_are_named() -> None:
    def broken(completions: list[str], **kwargs: Any) -> list[float]:
        raise KeyError("gone")

    async def broken_async(completions: list[str], **kwargs: Any) -> list[float]:
        raise RuntimeError("server down")

    with pytest.raises(RewardFunctionError, match=r"reward function broken raised KeyError\('gone'\) on the batch of 4 samples"):  # fmt: skip
        score_samples([broken], [1.0], ["trl"], samples(4))
    with pytest.raises(RewardFunctionError, match=r"reward function broken_async raised RuntimeError\('server down'\)"):  # fmt: skip
        score_samples([broken_async], [1.0], ["trl"], samples(4))


# -- reward_timeout -------------------------------------------------------------------------------


def test_reward_timeout_names_the_hung_function_and_the_sample() -> None:
    release = threading.Event()

    def fine(completion: str, answer: str, question: str) -> float:
        return 1.0

    def hung_on_sample_2(completion: str, answer: str, question: str) -> float:
        if completion == "c2":
            release.wait()
        return 1.0

    def hung_batch(completions: list[str], **kwargs: Any) -> list[float]:
        release.wait()
        return [1.0] * len(completions)

    try:
        with pytest.raises(
            RewardFunctionError,
            match=r"^reward function hung_on_sample_2 did not return within 0\.2 s \(reward_timeout\) on sample 2 \(prompt 1, completion 0\); raise reward_timeout or fix the function$",
        ):
            score_samples([fine, hung_on_sample_2], [1.0, 1.0], ["agilerl"] * 2, samples(4), reward_timeout=0.2)  # fmt: skip
        with pytest.raises(
            RewardFunctionError,
            match=r"reward function hung_batch did not return within 0\.2 s \(reward_timeout\) on the batch of 4 samples",
        ):
            score_samples([hung_batch], [1.0], ["trl"], samples(4), reward_timeout=0.2)
    finally:
        release.set()
    # the abandoned worker does not block the next call: a fresh one scores it
    scores = score_samples([fine], [1.0], ["agilerl"], samples(4), reward_timeout=5.0)
    assert scores.total.tolist() == [1.0] * 4


def test_reward_timeout_cancels_hung_async_functions() -> None:
    release, cancelled = threading.Event(), threading.Event()

    async def quick(completions: list[str], **kwargs: Any) -> list[float]:
        return [0.5] * len(completions)

    async def hung(completion: str, answer: str, question: str) -> float:
        try:
            while completion == "c3" and not release.is_set():
                await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return 1.0

    try:
        with pytest.raises(
            RewardFunctionError,
            match=r"reward function hung did not return within 0\.2 s \(reward_timeout\) on sample 3 \(prompt 1, completion 1\)",
        ):
            score_samples([quick, hung], [1.0, 1.0], ["trl", "agilerl"], samples(4), reward_timeout=0.2)  # fmt: skip
        assert cancelled.wait(timeout=30)  # hang guard only: cancelled on the loop, not left
    finally:
        release.set()


def test_without_reward_timeout_functions_run_on_the_calling_thread() -> None:
    threads: list[threading.Thread] = []

    def where(completion: str, answer: str, question: str) -> float:
        threads.append(threading.current_thread())
        return 0.0

    score_samples([where], [1.0], ["agilerl"], samples(2))
    assert threads == [threading.current_thread()] * 2  # e.g. math_verify's signals need it
    score_samples([where], [1.0], ["agilerl"], samples(2), reward_timeout=10.0)
    assert threads[2] is threads[3] is not threading.current_thread()  # one reused worker
    assert threads[2].daemon


@pytest.mark.parametrize("bad", [0, -1.0, math.nan, math.inf, True, "2"])
def test_reward_timeout_is_checked(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"`reward_timeout` must be a finite number of seconds > 0, or None"):  # fmt: skip
        score_samples([lambda c, a, q: 0.0], [1.0], ["agilerl"], samples(2), reward_timeout=bad)
    with pytest.raises(ValueError, match=r"`reward_timeout` must be"):
        prompt_gym([{"prompt": "p"}] * 2, lambda c, a, q: 0.0, reward_timeout=bad)


# -- float32 overflow -----------------------------------------------------------------------------


def test_rewards_that_overflow_float32_name_the_function_or_the_weight() -> None:
    def huge(completion: str, answer: str, question: str) -> float:
        return 1e39 if completion == "c1" else 0.0  # finite in float64, inf in float32

    def big(completions: list[str], **kwargs: Any) -> list[float]:
        return [3e38] * len(completions)  # fits float32; twice it does not

    with pytest.raises(ValueError, match=r"reward function huge returned 1e\+39 for sample 1 \(prompt 0, completion 1\): it overflows the float32 rewards"):  # fmt: skip
        score_samples([huge], [1.0], ["agilerl"], samples(4))
    with pytest.raises(ValueError, match=r"reward function big's 3e\+38 times its weight 2\.0 \(reward_weights\[0\]\) overflows the float32 rewards on sample 0"):  # fmt: skip
        score_samples([big], [2.0], ["trl"], samples(4))
    with pytest.raises(ValueError, match=r"the weighted sum of the rewards overflows float32 on sample 0"):  # fmt: skip
        score_samples([big, big], [1.0, 1.0], ["trl", "trl"], samples(4))
    with pytest.raises(ValueError, match=r"`weights` must be finite numbers; weight 1 \(of big\) is nan"):  # fmt: skip
        score_samples([big, big], [1.0, math.nan], ["trl", "trl"], samples(4))
    assert (
        score_samples([big], [1.0], ["trl"], samples(4)).total.tolist() == [pytest.approx(3e38)] * 4
    )


# -- prompt data rows -----------------------------------------------------------------------------


def test_an_empty_prompt_names_the_split_and_the_row() -> None:
    def trl(completions: list[str], **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    train = Dataset.from_list([{"prompt": "a"}, {"prompt": "b"}])
    test = Dataset.from_list([{"prompt": "a"}, {"prompt": ""}])
    with pytest.raises(ValueError, match=r"^row 1 of the test dataset renders to an empty prompt \(0 tokens; ''\): fill its 'prompt' column or drop the row"):  # fmt: skip
        ReasoningGym(train, test, tok(), trl, None, data_batch_size_per_gpu=1)


# -- verl -----------------------------------------------------------------------------------------


def test_verl_compute_score_is_detected_and_adapted() -> None:
    calls: list[tuple[Any, ...]] = []

    def compute_score(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> Any:  # fmt: skip
        calls.append((data_source, solution_str, ground_truth, extra_info))
        score = float(solution_str.strip() == ground_truth)
        return {"score": score, "acc": score} if data_source == "dict" else score

    rows = [
        {
            "data_source": "dict" if i % 2 else "plain",
            "prompt": [{"role": "user", "content": f"{i}+1"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(i + 1)},
            "extra_info": {"index": i},
        }
        for i in range(4)
    ]
    env = prompt_gym(rows, compute_score)
    env.reset()
    _, rewards = env.step([["1", "0"], ["2", "2"]])
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert rewards.tolist() == [[1.0, 0.0], [1.0, 1.0]]
    assert calls[0] == ("plain", "1", "1", {"index": 0})
    # the adapter alone is a TRL reward function (usable with TRL too)
    adapted = verl_reward(lambda solution_str, ground_truth: float(solution_str == ground_truth))
    assert detect_reward_style(adapted) == "trl"
    assert adapted(completions=["7", "8"], ground_truth=["7", "7"], prompts=["a", "b"]) == [1.0, 0.0]  # fmt: skip
    with pytest.raises(
        ValueError, match=r"verl_reward: the dataset has no reward_model\.ground_truth"
    ):
        adapted(completions=["7"], prompts=["a"])


def test_a_final_assistant_message_is_continued_not_answered() -> None:
    rows = [
        {"prompt": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "the"}]}
    ] * 2
    env = prompt_gym(rows, lambda completions, **kw: [0.0] * len(completions))
    assert env.reset()[0]["text"] == "<|user|>q<eos><|assistant|>the"  # TRL's continuation


def test_a_remote_reward_scores_a_whole_step_in_one_request() -> None:
    from rl_envs.remote_reward import RemoteReward, RewardServer

    requests: list[int] = []

    def judge(completions: list[Any], **kwargs: Any) -> list[float]:
        requests.append(len(completions))
        return [float(len(c)) for c in completions]

    with RewardServer(judge) as server:
        client = RemoteReward(server.url)
        assert detect_reward_style(client) == "trl"  # its signature names `completions`
        env = prompt_gym([{"prompt": "p"}] * 4, client)
        env.reset()
        _, rewards = env.step([["a", "bb"], ["", "c"]])
    assert requests == [4]  # one request for B x G = 4 completions
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert rewards.tolist() == [[1.0, 2.0], [0.0, 1.0]]


@pytest.mark.parametrize(
    ("value", "match"),
    [
        (
            None,
            r"compute_score judge returned None for sample 1; verl's compute_score returns a number",
        ),
        (
            {"acc": 1.0},
            r"compute_score judge returned a dict without 'score' \(keys \['acc'\]\) for sample 1",
        ),
        ({"score": None}, r"compute_score judge returned None for sample 1"),
    ],
)
def test_a_verl_none_is_an_error_not_a_silent_not_applicable(value: Any, match: str) -> None:
    """verl has no "not applicable": a None (or a dict without its score) used to become TRL's
    None, so the sample silently got reward 0."""

    def judge(data_source: Any, solution_str: str, ground_truth: str, extra_info: Any) -> Any:
        return value if solution_str == "c1" else 1.0

    s = samples(4)
    s.columns["answer"] = ["a"] * 4
    with pytest.raises(RewardFunctionError, match=match):
        score_samples([judge], [1.0], ["verl"], s)


def test_numpy_rewards_are_numbers() -> None:
    """TRL turns the returned list into a tensor: numpy scalars, ``np.bool_`` and 0-d arrays are
    numbers there, and here."""
    np = pytest.importorskip("numpy")

    def trl(completions: list[str], **kwargs: Any) -> list[Any]:
        return [np.bool_(True), np.float32(0.5), np.array(2.0), np.int64(3)]

    def agilerl(completion: str, answer: str, question: str) -> Any:
        return np.bool_(completion == "c0")

    # bit-exact: rewards are small dyadic constants, exact in float32
    assert score_samples([trl], [1.0], ["trl"], samples(4)).total.tolist() == [1.0, 0.5, 2.0, 3.0]
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert score_samples([agilerl], [1.0], ["agilerl"], samples(4)).total.tolist() == [1, 0, 0, 0]


# A Qwen2.5-style template: roles it does not know are left out without a word.
ROLE_CHAIN_TEMPLATE = (
    "{%- for m in messages -%}{%- if m['role'] in ['system', 'user', 'assistant'] -%}"
    "{{ '<|' + m['role'] + '|>' + m['content'] + '<eos>' }}{%- endif -%}{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|assistant|>' }}{%- endif -%}"
)


def test_a_message_the_chat_template_drops_names_the_row_and_the_role() -> None:
    """ShareGPT-style roles ('human') are dropped by templates that chain known roles: the
    model was silently trained on prompts missing the question."""
    t = char_tokenizer()
    t.chat_template = ROLE_CHAIN_TEMPLATE
    rows = [{"prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "q"}]},
            {"prompt": [{"role": "system", "content": "be brief"}, {"role": "human", "content": "q"}]}]  # fmt: skip
    with pytest.raises(ValueError, match=r"^the chat template dropped message 1 \(role 'human'\) of the prompt of row 1 of the train dataset: its content is not in the rendering; use a role the template renders"):  # fmt: skip
        prompt_gym(rows, lambda completions, **kw: [0.0] * len(completions), tokenizer=t)
    template = [{"role": "system", "content": "s"}, {"role": "human", "content": "{question}"}]
    with pytest.raises(ValueError, match=r"^the chat template dropped message 1 \(role 'human'\) of `conversation_template`"):  # fmt: skip
        ReasoningGym(qa_dataset(2), qa_dataset(2), t, lambda c, a, q: 0.0, template,
                     data_batch_size_per_gpu=1)  # fmt: skip
