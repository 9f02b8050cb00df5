"""A transformers that switched its PyTorch integration off gives a clear error, not dummy models."""

from __future__ import annotations

import pytest
import transformers.utils.import_utils
from rl_adapters import PolicyModel
from rl_adapters._compat import require_torch_integration
from rl_testing.models import tiny_qwen2


def test_disabled_torch_integration_names_both_versions(monkeypatch: pytest.MonkeyPatch) -> None:
    require_torch_integration()  # the installed pair is supported
    monkeypatch.setattr(transformers.utils.import_utils, "is_torch_available", lambda: False)
    with pytest.raises(ImportError, match=r"transformers \S+ has disabled .* for torch \S+"):
        require_torch_integration()
    with pytest.raises(ImportError, match="upgrade torch"):
        PolicyModel(tiny_qwen2(32))
