"""The files a run configuration names, found and checked when the YAML is read.

Relative paths of the data files (``data.train_path``, ``test_path``, ``offline_path``), the
chat template, the DeepSpeed config and the ``imports`` entries that are ``.py`` paths are the
working directory's, else, when they exist only there, the YAML file's (made absolute); data
files that do not exist fail here, before the model libraries are imported.
:data:`DATA_FILE_KINDS` maps a data file's suffix to the ``datasets`` builder that reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rl_train.user_code import ConfigError

if TYPE_CHECKING:
    from rl_train.config import RunConfig


#: Data file suffix -> the ``datasets`` builder that reads it.
DATA_FILE_KINDS = {"json": "json", "jsonl": "json", "csv": "csv", "parquet": "parquet"}


def _resolve_paths(config: RunConfig, base: Path) -> None:
    """Relative paths that exist only next to the YAML become absolute."""
    for owner, field_name in (
        (config, "deepspeed_config"),
        (config.data, "offline_path"),
        (config.data, "train_path"),
        (config.data, "test_path"),
    ):
        value = getattr(owner, field_name)
        if value is not None and not Path(value).exists() and (base / value).exists():
            setattr(owner, field_name, str(base / value))
    template = config.model.chat_template
    if (
        template is not None
        and _template_path(template)
        and not Path(template).exists()
        and (base / template).exists()
    ):
        config.model.chat_template = str(base / template)
    config.imports = [
        str(base / item)
        if _is_path(item) and not Path(item).exists() and (base / item).exists()
        else item
        for item in config.imports
    ]


def _template_path(value: str) -> bool:
    """Whether ``model.chat_template`` names a file rather than holding the template."""
    return "{" not in value and "\n" not in value and len(value) < 4096


def _is_path(item: str) -> bool:
    """Whether an ``imports`` entry names a file rather than a module."""
    return item.endswith(".py") or "/" in item or "\\" in item


def _check_data_files(config: RunConfig) -> None:
    """Data files that do not exist fail here, before the model libraries are imported."""
    d = config.data
    if d.hub is None and d.train_path is not None:
        kind = Path(d.train_path).suffix.lstrip(".") in DATA_FILE_KINDS
        if not kind or not Path(d.train_path).is_file():
            raise ConfigError(
                f"data.train_path {d.train_path!r} must be an existing .json, .jsonl, .csv or "
                ".parquet file"
            )
        if d.test_path is not None and not Path(d.test_path).is_file():
            raise ConfigError(f"data.test_path file {d.test_path!r} does not exist")
    if d.offline_path is not None and not Path(d.offline_path).is_file():
        raise ConfigError(f"data.offline_path {d.offline_path!r} does not exist")
    template = config.model.chat_template
    if template is not None and _template_path(template) and not Path(template).is_file():
        raise ConfigError(
            f"model.chat_template {template!r} is neither a Jinja template (it has no '{{') nor "
            "an existing file"
        )
