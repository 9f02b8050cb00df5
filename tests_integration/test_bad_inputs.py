"""Every row of the bad-input catalogue raises the stated error naming the argument."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bad_inputs import cases, markdown

ROOT = Path(__file__).resolve().parents[1]


def test_catalogue_has_at_least_30_cases_across_the_packages() -> None:
    table = cases()
    assert len(table) >= 30
    assert len({c.package for c in table}) == 8


@pytest.mark.parametrize("case", cases(), ids=lambda c: f"{c.package}:{c.call}")
def test_bad_input(case) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(case.error, match=re.escape(case.names)):
        case.run()


def test_docs_table_is_current() -> None:
    assert (ROOT / "docs" / "bad-inputs.md").read_text() == markdown()
