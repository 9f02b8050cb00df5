"""Peers outside the run columns of :mod:`matrix` whose code was read, not run.

``docs/conformance.md``'s "Read, not run" table (written by ``run.py``).
"""

from __future__ import annotations

#: Peers outside the run columns whose code was read, not run (their trainers pull their whole
#: stack in): per function, (peer and source read, the reproducing call and why it is not run).
READ: dict[str, tuple[str, str]] = {
    "rl_advantages.max_rl": (
        "prime-rl `max_rl` (`src/prime_rl/orchestrator/algo/max_rl.py`, commit 0d6738f)",
        "equal: `(reward - group mean) / group mean`, 0 for a group whose mean is <= 0 (prime-rl "
        "computes in float32); read, not run: `MaxRLAlgorithm.score_group` is a method of the "
        "async orchestrator, which imports prime-rl's whole stack",
    ),
    "rl_advantages.gdpo": (
        'TRL 1.16.0 `GRPOConfig(multi_objective_aggregation="normalize_then_sum")` '
        "(`trl/trainer/grpo_trainer.py`, `_generate_and_score_completions`)",
        "equal with `eps=1e-4, batch_scale=True` and `reward_weights` as `weights` (a "
        "transcription of TRL's lines is the float64 reference of `test_multi_reward.py`); "
        "read, not run: the lines sit inside TRL's generation step. TRL excludes a reward a "
        "function left `None` from that reward's statistics; ours masks the sample "
        '(`nonfinite="mask"`)',
    ),
    "rl_losses.dro_loss": (
        "Tinker `dro` (tinker-docs.thinkingmachines.ai/tinker/losses/dro)",
        '`aggregation="seq_mean_token_sum", normalizer=1` (Tinker sums over tokens); read, not '
        "run: Tinker's losses run on its service (tested against the documented formula)",
    ),
    "rl_losses.clipped_surrogate": (
        "Tinker `importance_sampling` (tinker-docs.thinkingmachines.ai/losses)",
        'registered as `importance_sampling`: `ratio_bounds=(0, inf), aggregation="seq_mean_'
        'token_sum", normalizer=1`; read, not run (tested against the documented formula)',
    ),
    "rl_losses.reinforce_loss": (
        "Tinker `cross_entropy` (tinker-docs.thinkingmachines.ai/tinker/losses)",
        'registered as `cross_entropy`: `advantages=weights, aggregation="seq_mean_token_sum", '
        "normalizer=1`; read, not run (tested against the documented formula)",
    ),
    "rl_losses.get_policy_loss": (
        "Tinker `stable_reinforce` (tinker-docs.thinkingmachines.ai/tinker/losses/stable-reinforce)",
        "not implemented, refused by name: the page gives no formula (it reads sampler-recorded "
        "stability info); read only, nothing to run",
    ),
}
