"""rl-advantages: every advantage and return estimator of LLM RL, as pure tensor functions.

Shapes use one glossary: ``B`` prompts, ``G`` samples per prompt, ``N = B*G`` sequences, ``T``
tokens, ``K`` turns. ``mask`` is True where an element counts; values at masked positions never
influence a result. A mask is bool; a 0/1 integer or float mask is accepted, any other value
raises (a mask is not a weight). Device follows the inputs. Dtype, one rule for every function:
integer and bool rewards, scores and values are promoted to torch's default float dtype (0/1
correctness rewards are valid input), and inputs of different float dtypes (float32 rewards with
float64 values, bfloat16 scores with a float32 KL) compute in their ``torch.promote_types``,
which is the dtype of the result. See the README for the conventions table (our defaults against
AgileRL, TRL, verl and OpenRLHF).
"""

from importlib.metadata import version as _version

from rl_advantages.group import (
    dynamic_sampling_mask,
    gpg,
    group_relative,
    group_relative_per_turn,
    max_rl,
    opo,
    pass_at_k,
    remax,
    rloo,
)
from rl_advantages.multi_reward import gdpo
from rl_advantages.registry import available_estimators, get_estimator, register_estimator
from rl_advantages.reinforce import kl_in_reward, reinforce_plus_plus, reinforce_plus_plus_baseline
from rl_advantages.returns import AdvantagesReturns, discounted_returns, gae, rebn
from rl_advantages.shaping import overlong_penalty
from rl_advantages.stats import masked_mean, masked_sum, masked_var, whiten
from rl_advantages.token_baseline import optimal_token_baseline
from rl_advantages.turns import TurnValues, broadcast_to_tokens, pool_to_turns, turn_mask_from_ids

__version__: str = _version("rl-advantages")

__all__ = [
    "AdvantagesReturns",
    "TurnValues",
    "__version__",
    "available_estimators",
    "broadcast_to_tokens",
    "discounted_returns",
    "dynamic_sampling_mask",
    "gae",
    "gdpo",
    "get_estimator",
    "gpg",
    "group_relative",
    "group_relative_per_turn",
    "kl_in_reward",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "max_rl",
    "opo",
    "optimal_token_baseline",
    "overlong_penalty",
    "pass_at_k",
    "pool_to_turns",
    "rebn",
    "register_estimator",
    "reinforce_plus_plus",
    "reinforce_plus_plus_baseline",
    "remax",
    "rloo",
    "turn_mask_from_ids",
    "whiten",
]
