"""``rl-train run`` with TRL-style data and reward functions: JSONL/Parquet files, a hub name,
``data.reward`` lists with weights and styles, ``model.chat_template``."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from datasets import Dataset
from rl_train.builder import build_env, build_model, import_user_code
from rl_train.cli import EXIT_USAGE, main
from rl_train.config import load_config

CHAT = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"

REWARDS = """
async def right(completions, answer, **kwargs):
    return [1.0 if c[0]["content"] == a else 0.0 for c, a in zip(completions, answer)]


def odd_only(completions, level, **kwargs):
    return [None if lv % 2 == 0 else 0.5 for lv in level]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return {"score": 2.0 if solution_str == ground_truth else 0.0}
"""


def rows(n: int) -> list[dict[str, object]]:
    return [
        {"prompt": [{"role": "user", "content": f"{i}+1=?"}], "answer": str(i + 1), "level": i}
        for i in range(n)
    ]


def write_data(directory: Path, kind: str) -> Path:
    if kind == "jsonl":
        path = directory / "train.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows(10)))
    else:
        path = directory / "train.parquet"
        Dataset.from_list(rows(10)).to_parquet(str(path))
    (directory / "my_rewards.py").write_text(textwrap.dedent(REWARDS))
    return path


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_prompt_files_and_trl_rewards_build_an_environment(
    kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = write_data(tmp_path, kind)
    (tmp_path / "c.yaml").write_text(
        textwrap.dedent(
            f"""
            imports: [my_rewards.py]
            model: {{name: tiny, chat_template: {json.dumps(CHAT)}}}
            data:
              train_path: {data.name}
              reward: [my_rewards:right, my_rewards:odd_only, my_rewards:compute_score]
              reward_weights: [1.0, 2.0, 1.0]
              reward_style: [auto, trl, verl]
              prompts_per_step: 3
            """
        )
    )
    monkeypatch.chdir("/")  # the data and the module are found next to the YAML
    config = load_config(tmp_path / "c.yaml")
    import_user_code(config.imports)
    _, tokenizer = build_model(config)
    env = build_env(config, tokenizer)
    assert env.conversation_template is None  # prompt data: a prompt column, no question
    assert env.num_test_prompts == 1  # the last 10% of the file
    batch = env.reset()
    assert batch[0]["text"].startswith("user: ") and batch[0]["text"].endswith("+1=?\nassistant:")
    levels = [int(p["question"].split("+")[0]) for p in batch]
    _, rewards = env.step([[p["answer"], "x"] for p in batch])
    for level, (good, bad) in zip(levels, rewards.tolist(), strict=True):
        odd = 1.0 if level % 2 else 0.0  # 2.0 * 0.5 where it applies
        assert good == 1.0 + 2.0 + odd and bad == odd


def test_question_answer_files_still_use_the_template(tmp_path: Path) -> None:
    path = tmp_path / "qa.parquet"
    Dataset.from_dict(
        {"question": ["1", "2", "3", "4"], "answer": ["2", "3", "4", "5"]}
    ).to_parquet(str(path))
    config = load_config(None, [f"data.train_path={path}", "data.prompts_per_step=2",
                                "data.template=n {question}"])  # fmt: skip
    env = build_env(config, build_model(config)[1])
    assert env.reset()[0]["text"].startswith("n ")


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (["data.reward=[demo, exact_match]", "data.reward_weights=[1.0]"],
         "data.reward_weights has 1 entries for 2 reward functions"),
        (["data.reward_style=openai"], "data.reward_style 'openai' is unknown"),
        (["data.reward=[demo]", "data.reward_style=[trl, trl]"], "data.reward_style has 2 entries"),
        (["data.reward=[]"], "data.reward must be a name or a non-empty list"),
        (["model.chat_template=no_such.jinja"], "model.chat_template 'no_such.jinja' is neither"),
        (["data.train_path=train.txt"], "must be an existing .json, .jsonl, .csv or .parquet file"),
    ],
)  # fmt: skip
def test_bad_reward_and_data_settings_are_one_line_exit_2(
    lines: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "c.yaml").write_text("algo: grpo\n")
    code = main(["run", str(tmp_path / "c.yaml"), *lines, f"train.run_dir={tmp_path}", "--quiet"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE, err
    assert message in err and len(err.strip().splitlines()) == 1, err


def test_conversations_without_a_chat_template_and_an_offline_hub_name_say_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    data = write_data(tmp_path, "jsonl")
    config = tmp_path / "c.yaml"
    config.write_text(f"data:\n  train_path: {data}\n  prompts_per_step: 2\n")
    code = main(["run", str(config), "--quiet"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "is a conversation but the tokenizer has no chat template" in err
    last = err.strip().splitlines()[-1]  # (after the progress bar of datasets' file loader)
    assert (
        last.startswith("rl-train: data: the prompt of row 0")
        and "set tokenizer.chat_template" in last
    )
    # a hub name passes validation, and fails with the fix when it cannot be downloaded
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # an empty cache
    # the libraries read the variables when imported: offline now, not after their HTTP
    # retries (about 23 s of backoff where the hub cannot be reached)
    import datasets.config
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    assert load_config(None, ["data.hub=trl-lib/DeepMath-103K"]).data.hub == "trl-lib/DeepMath-103K"
    code = main(["run", str(config), "data.hub=trl-lib/DeepMath-103K", "--quiet"])
    err = capsys.readouterr().err
    assert code == EXIT_USAGE
    assert "data.hub 'trl-lib/DeepMath-103K' could not be loaded" in err
    assert "set data.train_path instead" in err and len(err.strip().splitlines()) == 1
