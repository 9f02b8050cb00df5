"""lora_target_scope on a real (tiny, random) multimodal model: LLaVA = CLIP vision + Llama."""

import pytest
import rl_adapters
import torch
from peft import LoraConfig
from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration


def _llava() -> LlavaForConditionalGeneration:
    torch.manual_seed(0)
    vision = CLIPVisionConfig(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        image_size=32, patch_size=16,
    )  # fmt: skip
    text = LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2,
    )  # fmt: skip
    return LlavaForConditionalGeneration(
        LlavaConfig(vision_config=vision, text_config=text, image_token_index=63)
    )


def _lora_modules(policy: rl_adapters.PolicyModel) -> set[str]:
    return {n.split(".lora_")[0] for n, _ in policy.named_parameters() if ".lora_A." in n}


@pytest.mark.parametrize("targets", [["q_proj", "v_proj"], "all-linear"])
def test_language_scope_keeps_lora_off_the_vision_tower(targets: list[str] | str) -> None:
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=targets, lora_dropout=0.0)
    policy = rl_adapters.PolicyModel(_llava(), lora_config=lora, reference=None)
    modules = _lora_modules(policy)
    assert modules
    assert all(".language_model." in m for m in modules), sorted(modules)
    ids = torch.randint(0, 60, (2, 5), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        base = _llava()(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
        torch.testing.assert_close(policy.logits(ids, torch.ones_like(ids)), base)


def test_all_scope_also_adapts_the_vision_tower() -> None:
    lora = LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    policy = rl_adapters.PolicyModel(
        _llava(), lora_config=lora, reference=None, lora_target_scope="all"
    )
    modules = _lora_modules(policy)
    assert any("vision_tower" in m for m in modules)
    assert any(".language_model." in m for m in modules)


def test_scope_rejects_a_regex_and_bad_values() -> None:
    regex = LoraConfig(r=2, target_modules=r".*q_proj", lora_dropout=0.0)
    with pytest.raises(ValueError, match="cannot rewrite a regex"):
        rl_adapters.PolicyModel(_llava(), lora_config=regex)
    lora = LoraConfig(r=2, target_modules=["q_proj"], lora_dropout=0.0)
    with pytest.raises(ValueError, match="`lora_target_scope` must be"):
        rl_adapters.PolicyModel(_llava(), lora_config=lora, lora_target_scope="vision")  # type: ignore[arg-type]
