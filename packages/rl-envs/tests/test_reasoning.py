"""ReasoningGym with real ``datasets.Dataset`` objects and the locally built tokenizer."""

from __future__ import annotations

import math
import threading
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from envs_testlib import TEMPLATE, encode, qa_dataset, tok
from rl_envs.reasoning import PromptBatch, ReasoningGym, RewardFunctionError, render_prompt

EOS = 2


def answer_checker(seen: list[tuple[str, str, str]]):  # type: ignore[no-untyped-def]
    """A reward fn that records its calls and returns 1.0 iff the completion names the answer."""

    def reward(completion: str, answer: str, question: str) -> float:
        seen.append((completion, answer, question))
        return float(completion == answer)

    return reward


def gym(train: int = 10, test: int = 3, batch: int = 4, **kw) -> ReasoningGym:  # type: ignore[no-untyped-def]
    kw.setdefault("reward_fn", lambda c, a, q: 0.0)
    return ReasoningGym(
        qa_dataset(train),
        qa_dataset(test, offset=100),
        tok(),
        conversation_template=TEMPLATE,
        data_batch_size_per_gpu=batch,
        **kw,
    )


def completions_for(batch: PromptBatch, texts_per_prompt: list[list[str]]) -> list[torch.Tensor]:
    """Token tensors [G, P + T] with the prompt in front, right-padded with pad 0 after EOS."""
    out = []
    for prompt, texts in zip(batch, texts_per_prompt, strict=True):
        rows = [prompt["input_ids"][0].tolist() + encode(t) + [EOS] for t in texts]
        width = max(map(len, rows)) + 2
        out.append(torch.tensor([r + [0] * (width - len(r)) for r in rows]))
    return out


def test_prompts_are_hf_style_dicts_rendered_with_the_chat_template() -> None:
    env = gym()
    batch = env.reset()
    assert isinstance(batch, PromptBatch)
    assert len(batch) == 4
    for p in batch:
        assert set(p) == {"input_ids", "attention_mask", "text", "question", "answer", "index"}
        assert p["input_ids"].shape == p["attention_mask"].shape == (1, len(encode(p["text"])))
        assert p["text"] == f"<|user|>Q: {p['question']}\nA:<eos><|assistant|>"
        assert p["input_ids"][0].tolist() == encode(p["text"])
        assert p["answer"] == "a" + p["question"][1:]
    assert batch.answers == [p["answer"] for p in batch]


def test_every_reward_is_against_its_own_prompts_answer_across_epochs_and_eval() -> None:
    """Several epochs, shuffled, with evaluation windows interleaved (AgileRL #591)."""
    seen: list[tuple[str, str, str]] = []
    env = gym(train=6, test=5, batch=2, reward_fn=answer_checker(seen), seed=3)
    batch = env.reset()
    for step in range(25):
        # completion g of prompt b: the right answer for g == 0, a wrong one otherwise
        texts = [[p["answer"], p["answer"] + "x"] for p in batch]
        nxt, rewards = env.step(completions_for(batch, texts))
        # bit-exact: rewards are small dyadic constants, exact in float32
        assert rewards.tolist() == [[1.0, 0.0]] * len(batch)
        batch = nxt
        if step % 4 == 1:
            with env.eval_mode():
                eb = env.reset()
                for _ in range(3):
                    eb2, er = env.step([[p["answer"]] for p in eb])
                    assert er.tolist() == [[1.0]] * len(eb)
                    assert all(p["index"] >= 0 for p in eb)
                    assert all(q.startswith("q10") for q in eb.questions)
                    eb = eb2
    for completion, answer, question in seen:
        assert answer[1:] == question[1:]  # the answer belongs to the question it was scored with
        assert completion.rstrip("x") == answer
    assert env.num_epochs >= 25 * 2 // 6 - 1


def test_epochs_cover_the_train_split_and_reshuffle() -> None:
    env = gym(train=8, batch=4, seed=1)
    batch = env.reset()
    epochs: dict[int, list[int]] = {}
    for _ in range(6):
        epochs.setdefault(batch.epoch, []).extend(batch.indices)
        batch, _ = env.step([["x"] for _ in batch])
    assert sorted(epochs[0]) == sorted(epochs[1]) == list(range(8))
    assert epochs[0] != epochs[1]  # reshuffled
    assert env.num_epochs == env.dataset_passes == 3
    assert len(env) == 2


def test_partial_last_train_batch_is_dropped_but_eval_covers_everything() -> None:
    env = gym(train=5, test=5, batch=2)
    batch = env.reset()
    seen = [batch.indices]
    for _ in range(1):
        batch, _ = env.step([["x"]] * 2)
        seen.append(batch.indices)
    assert all(len(s) == 2 for s in seen)
    with env.eval_mode():
        eb = env.reset()
        sizes = [len(eb)]
        for _ in range(2):
            eb, _ = env.step([["x"]] * len(eb))
            sizes.append(len(eb))
    assert sizes == [2, 2, 1]


def test_eval_mode_keeps_the_training_batch_pending() -> None:
    seen: list[tuple[str, str, str]] = []
    env = gym(reward_fn=answer_checker(seen))
    batch = env.reset()
    with env.eval_mode():
        assert env.evaluating
        env.reset()
    assert not env.evaluating
    _, rewards = env.step([[p["answer"]] for p in batch])
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert rewards.flatten().tolist() == [1.0] * 4


def test_step_against_another_batch_is_refused() -> None:
    env = gym()
    first = env.reset()
    second, _ = env.step([["x"]] * 4, prompts=first)
    with pytest.raises(ValueError, match="not the batch this environment handed out last"):
        env.step([["x"]] * 4, prompts=first)
    env.step([["x"]] * 4, prompts=second)


def test_sharding_with_an_accelerator_splits_the_rows() -> None:
    def rows(rank: int) -> set[int]:
        acc = SimpleNamespace(num_processes=2, process_index=rank)
        env = gym(train=8, batch=2, accelerator=acc)
        batch, out = env.reset(), set()
        for _ in range(2):
            out |= set(batch.indices)
            batch, _ = env.step([["x"]] * 2)
        return out

    r0, r1 = rows(0), rows(1)
    assert not (r0 & r1)
    assert r0 | r1 == set(range(8))


def test_weighted_reward_functions_and_components() -> None:
    def exact(c: str, a: str, q: str) -> float:
        return float(c == a)

    def length(c: str, a: str, q: str) -> float:
        return len(c)

    env = gym(reward_fn=[exact, length], reward_weights=[2.0, 0.5])
    batch = env.reset()
    _, rewards = env.step([[p["answer"], "zz"] for p in batch])
    ans_len = [len(p["answer"]) for p in batch]
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert rewards.tolist() == [[2.0 + 0.5 * n, 1.0] for n in ans_len]
    assert set(env.last_reward_components) == {"exact", "length"}


def test_completions_as_generated_tokens_only() -> None:
    seen: list[tuple[str, str, str]] = []
    env = gym(reward_fn=answer_checker(seen), completions_include_prompt=False)
    batch = env.reset()
    comps = [torch.tensor([[*encode(p["answer"]), EOS, 0]]) for p in batch]
    _, rewards = env.step(comps)
    # bit-exact: rewards are small dyadic constants, exact in float32
    assert rewards.flatten().tolist() == [1.0] * 4


def test_render_prompt_without_chat_template_and_with_braces() -> None:
    t = SimpleNamespace(chat_template=None)
    tpl = [
        {"role": "system", "content": 'json: {"k": 1}'},
        {"role": "user", "content": "{question}?"},
    ]
    assert render_prompt(t, tpl, {"question": "q1"}) == 'json: {"k": 1}\nq1?'


def test_render_prompt_reads_the_template_like_str_format() -> None:
    t = SimpleNamespace(chat_template=None)
    tpl = [
        {"role": "system", "content": r'{"k": {"j": 1}} \boxed{} \frac{1}{2} {{question}} {{x}}'},
        {"role": "user", "content": "{question}{x}"},
    ]
    assert (
        render_prompt(t, tpl, {"question": "q1", "x": 3})
        == '{"k": {"j": 1}} \\boxed{} \\frac{1}{2} {question} {x}\nq13'
    )


def test_render_prompt_rejects_a_placeholder_the_row_lacks() -> None:
    t = SimpleNamespace(chat_template=None)
    tpl = [{"role": "user", "content": "{qestion}?"}]
    with pytest.raises(
        ValueError,
        match=r"`conversation_template` message 0 \('user'\) has the placeholder \{qestion\}, "
        r"which is not a key of the row \(did you mean \{question\}\?\)\. Available: "
        r"\['question'\]",
    ):
        render_prompt(t, tpl, {"question": "q1"})


def _env_with(template: str, train: Dataset | None = None, test: Dataset | None = None, **kw):  # type: ignore[no-untyped-def]
    """An env whose second message is ``template``; the train split is not shuffled."""
    kw.setdefault("shuffle", False)
    return ReasoningGym(
        qa_dataset(4) if train is None else train,
        qa_dataset(2, offset=100) if test is None else test,
        tok(),
        lambda c, a, q: 0.0,
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": template}],
        2,
        **kw,
    )


def test_unknown_placeholder_names_it_the_argument_and_the_columns() -> None:
    with pytest.raises(ValueError, match="questoin") as info:
        _env_with("Q: {questoin}\nA:")
    message = str(info.value)
    assert message.startswith(
        "`conversation_template` message 1 ('user') has the placeholder {questoin}, which is "
        "not a column of the train dataset (did you mean {question}?). Available: ['question']."
    )
    assert "double them: {{questoin}}" in message


def test_every_unknown_placeholder_is_reported() -> None:
    with pytest.raises(ValueError, match=r"\{topic\}.*\{level\}") as info:
        _env_with("{topic}: {question} ({level})")
    assert "did you mean" not in str(info.value)  # nothing close to 'topic' or 'level'


def test_placeholder_must_be_a_column_of_the_test_split_too() -> None:
    train = Dataset.from_dict(
        {"question": ["q0", "q1"], "answer": ["a0", "a1"], "topic": ["x", "y"]}
    )
    test = qa_dataset(2, offset=100)
    with pytest.raises(
        ValueError, match=r"\{topic\}, which is not a column of the test dataset\. Available"
    ):
        _env_with("[{topic}] {question}", train, test)
    env = _env_with("[{topic}] {question}", train, train)
    assert [p["text"] for p in env.reset()] == [
        "<|system|>Be brief.<eos><|user|>[x] q0<eos><|assistant|>",
        "<|system|>Be brief.<eos><|user|>[y] q1<eos><|assistant|>",
    ]


def test_escaped_braces_are_text_not_placeholders() -> None:
    env = _env_with("{{questoin}} {{answer}} {question}")
    assert env.reset()[0]["text"] == (
        "<|system|>Be brief.<eos><|user|>{questoin} {answer} q0<eos><|assistant|>"
    )


def test_question_column_mapping_fills_both_names() -> None:
    ds = Dataset.from_dict({"prompt": ["p0", "p1"], "solution": ["s0", "s1"]})
    kw = {"question_column": "prompt", "answer_column": "solution"}
    env = _env_with("{prompt}|{question}", ds, ds, **kw)
    assert env.reset()[0]["text"] == "<|system|>Be brief.<eos><|user|>p0|p0<eos><|assistant|>"
    with pytest.raises(ValueError, match="would show the answer"):
        _env_with("{prompt} {solution}", ds, ds, **kw)
    # ``answer`` is no column here: a placeholder for it is unknown, not the answer
    with pytest.raises(
        ValueError, match=r"\{answer\}, which is not a column of the train dataset.*'prompt'"
    ):
        _env_with("{prompt} {answer}", ds, ds, **kw)


@pytest.mark.parametrize(
    ("template", "match"),
    [
        ("a } b {question}", r"message 1 \('user'\) is not a valid template \(Single '\}'"),
        ("{question", r"is not a valid template .*write a literal brace as '\{\{' or '\}\}'"),
        ("{question!r}", r"placeholder \{question!r\}: placeholders take no conversion"),
        ("{question:>9}", r"write \{question\}; to keep the braces as text, double them"),
    ],
)
def test_malformed_templates_are_rejected(template: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _env_with(template)


def test_max_context_length_drops_long_prompts_with_a_warning() -> None:
    ds = Dataset.from_dict({"question": ["a", "b" * 50, "c", "d"], "answer": ["1", "2", "3", "4"]})
    with pytest.warns(UserWarning, match="1 train prompt"):
        env = ReasoningGym(
            ds, ds.select([0]), tok(), lambda c, a, q: 0.0, TEMPLATE, 2, max_context_length=30
        )
    assert len(env) == 1


# -- bad input ------------------------------------------------------------------------------


def test_missing_columns_lists_the_columns_found() -> None:
    ds = Dataset.from_dict({"prompt": ["x"], "solution": ["y"]})
    with pytest.raises(
        ValueError,
        match=r"lacks the column\(s\) \['question', 'answer'\]; its columns are \['prompt', 'solution'\]",
    ):
        ReasoningGym(ds, ds, tok(), lambda c, a, q: 0.0, TEMPLATE, 1)
    env = ReasoningGym(ds, ds, tok(), lambda c, a, q: 0.0, [{"role": "user", "content": "{prompt}"}], 1,
                       question_column="prompt", answer_column="solution")  # fmt: skip
    assert env.reset().answers == ["y"]


def test_empty_dataset() -> None:
    empty = Dataset.from_dict({"question": [], "answer": []})
    with pytest.raises(ValueError, match="the test dataset is empty"):
        ReasoningGym(qa_dataset(4), empty, tok(), lambda c, a, q: 0.0, TEMPLATE, 2)


def test_batch_larger_than_the_data() -> None:
    with pytest.raises(ValueError, match="data_batch_size_per_gpu=8 exceeds the 3 train rows"):
        gym(train=3, batch=8)


@pytest.mark.parametrize("value", [math.nan, math.inf, "1.0", None, [1.0]])
def test_reward_fn_returning_nan_or_a_non_number(value: object) -> None:
    env = gym(reward_fn=lambda c, a, q: value)
    env.reset()
    with pytest.raises(
        ValueError,
        match=r"returned .* for sample 0 \(prompt 0, completion 0\); it must return a finite number",
    ):
        env.step([["x"]] * 4)


def test_reward_fn_that_raises_names_the_sample_and_text() -> None:
    def picky(c: str, a: str, q: str) -> float:
        if c == "boom":
            raise KeyError("no")
        return 0.0

    env = gym(reward_fn=picky)
    env.reset()
    with pytest.raises(
        RewardFunctionError,
        match=r"reward_fn picky raised KeyError\('no'\) on sample 5 \(prompt 2, completion 1\); completion: 'boom'",
    ):
        env.step([["a", "b"], ["c", "d"], ["e", "boom"], ["f", "g"]])


def test_a_hung_reward_fn_times_out_with_reward_timeout() -> None:
    release = threading.Event()

    def slow(c: str, a: str, q: str) -> float:
        if c == "stuck":
            release.wait()
        return 1.0

    env = gym(reward_fn=slow, reward_timeout=0.2)
    env.reset()
    try:
        with pytest.raises(
            RewardFunctionError,
            match=r"^reward function slow did not return within 0\.2 s \(reward_timeout\) on sample 3 \(prompt 1, completion 1\); raise reward_timeout or fix the function$",
        ):
            env.step([["a", "b"], ["c", "stuck"], ["e", "f"], ["g", "h"]])
    finally:
        release.set()


def test_a_reward_that_overflows_float32_names_the_function() -> None:
    env = gym(reward_fn=lambda c, a, q: 1e39)  # finite in float64: passes the finiteness check
    env.reset()
    with pytest.raises(ValueError, match=r"reward function <lambda> returned 1e\+39 for sample 0 .*overflows the float32 rewards"):  # fmt: skip
        env.step([["x"]] * 4)


def test_none_answers_name_the_split_row_and_column() -> None:
    def exact(c: str, a: str, q: str) -> float:
        return float(c == a)

    test = Dataset.from_dict({"question": ["q0", "q1"], "answer": ["a0", None]})
    with pytest.raises(ValueError, match=r"^row 1 of the test dataset has no answer \(None in column 'answer'\), which reward function exact would score against the text 'None'"):  # fmt: skip
        ReasoningGym(qa_dataset(4), test, tok(), exact, TEMPLATE, 2)
    # a TRL-style function reads the raw column (None stays None): nothing to refuse
    seen: list[list[object]] = []

    def trl(completions: list[str], answer: list[object], **kwargs: object) -> list[float]:
        seen.append(answer)
        return [0.0] * len(completions)

    env = ReasoningGym(qa_dataset(4), test, tok(), trl, TEMPLATE, 2, shuffle=False)
    with env.eval_mode():
        env.reset()
        env.step([["x"], ["y"]])
    assert seen == [["a0", None]]


def test_wrong_number_of_completions() -> None:
    env = gym()
    env.reset()
    with pytest.raises(
        ValueError, match="`completions` has 3 entries but the current batch has 4 prompts"
    ):
        env.step([["x"]] * 3)
    with pytest.raises(ValueError, match="same number G >= 1"):
        env.step([["x"], ["x", "y"], ["x"], ["x"]])


def test_step_before_reset_and_tokens_without_their_prompt() -> None:
    env = gym()
    with pytest.raises(RuntimeError, match="call reset"):
        env.step([["x"]] * 4)
    env.reset()
    with pytest.raises(ValueError, match="do not start with their prompt"):
        env.step([torch.tensor([[5, 6, 7]])] * 4)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"data_batch_size_per_gpu": 0}, "`data_batch_size_per_gpu` must be >= 1"),
        ({"reward_fn": []}, "`reward_fn` must be a callable"),
        ({"reward_weights": [1.0, 2.0]}, "`reward_weights` has 2 entries for 1 reward"),
        (
            {"reward_weights": [math.nan]},
            r"`reward_weights` must be finite numbers, one per reward function; entry 0 is nan",
        ),
        (
            {"reward_weights": [math.inf]},
            r"`reward_weights` must be finite numbers.*entry 0 is inf",
        ),
        ({"reward_weights": ["a"]}, r"`reward_weights` must be finite numbers.*entry 0 is 'a'"),
        ({"reward_timeout": 0}, r"`reward_timeout` must be a finite number of seconds > 0"),
        ({"conversation_template": []}, "`conversation_template` must be a non-empty list"),
        (
            {"conversation_template": [{"role": "user", "content": "{question} -> {answer}"}]},
            "would show the answer",
        ),
    ],
)
def test_constructor_arguments_checked(kw: dict[str, object], match: str) -> None:
    args: dict[str, object] = {"train_dataset": qa_dataset(4), "test_dataset": qa_dataset(2), "tokenizer": tok(),
            "reward_fn": lambda c, a, q: 0.0, "conversation_template": TEMPLATE, "data_batch_size_per_gpu": 2}  # fmt: skip
    args.update(kw)
    with pytest.raises(ValueError, match=match):
        ReasoningGym(**args)  # type: ignore[arg-type]


def test_state_dict_resumes_the_same_batches() -> None:
    import json

    a = gym(train=10, batch=3, seed=5)
    a.reset()
    for _ in range(4):
        a.step([["x"]] * 3)
    state = json.loads(json.dumps(a.state_dict()))  # JSON types only
    b = gym(train=10, batch=3, seed=5)
    b.load_state_dict(state)
    for _ in range(6):
        na, _ = a.step([["x"]] * 3)
        nb, _ = b.step([["x"]] * 3)
        assert na.indices == nb.indices
        assert (na.epoch, na.step) == (nb.epoch, nb.step)
    assert a.num_epochs == b.num_epochs


def test_render_prompt_imports_from_every_former_place() -> None:
    import rl_envs
    import rl_envs.reasoning
    import rl_envs.templates

    assert rl_envs.render_prompt is rl_envs.reasoning.render_prompt is render_prompt
    assert render_prompt is rl_envs.templates.render_prompt
    assert "render_prompt" in rl_envs.reasoning.__all__
