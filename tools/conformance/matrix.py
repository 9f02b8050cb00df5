"""The conformance matrix: for each public estimator and loss, per peer, the call that reproduces
the peer's numbers, or why not. Plain data (no torch): the unit tests of rl-advantages,
rl-losses and rl-kernels read it (every public function must have a row with a cell per peer),
and ``tools/conformance/run.py`` checks every listed case against the peer's own code and
writes ``docs/conformance.md``.

A cell is ``(status, text, cases)``: status ``"equal"`` (default arguments reproduce the
peer), ``"args"`` (equal with the arguments in ``text``), ``"design"`` (differs by design: the
reason is ``text``) or ``"none"`` (the peer ships no counterpart). ``cases`` name the peer
script's cases (``peer_<peer>.py``) that ``ours.py`` reproduces under the mapping; each runs
on groups of 2, 4 and 5 with padded, holed and empty rows. ``"design"`` cells may list cases
in ``DIFFERS``: compared where the documented cause is absent, to show it is the only one.
"""

from __future__ import annotations

PEERS = ("verl", "openrlhf", "trl", "liger", "agilerl")
PEER_LABELS = {
    "verl": "verl 0.9.1",
    "openrlhf": "OpenRLHF 0.11.2",
    "trl": "TRL 1.16.0",
    "liger": "Liger 0.8.5",
    "agilerl": "AgileRL 2.58.0",
}
PEER_PACKAGES = {
    "verl": "verl==0.9.1",
    "openrlhf": "openrlhf==0.11.2",
    "trl": "trl==1.16.0",
    "liger": "liger-kernel==0.8.5",
    "agilerl": "agilerl==2.58.0",
}
#: What each peer's math modules import, installed next to the ``--no-deps`` peer (CPU wheels).
PEER_EXTRAS = {
    "verl": ["packaging", "ray", "tensordict", "omegaconf", "transformers", "codetiming", "orjson"],
    "openrlhf": [],
    "trl": ["packaging", "transformers", "accelerate", "datasets"],
    "liger": [],
    "agilerl": [
        "lazy_loader",
        "gymnasium",
        "tensordict",
        "pyyaml",
        "accelerate",
        "dill",
        "peft",
        "packaging",
        "transformers",
        "agilerl-arena==1.29.0",  # provides agilerl.arena, which agilerl.algorithms imports
        "pillow",
        "pettingzoo",
        "fastrand",
        "wandb",
    ],
}

#: Tolerances (rtol = atol) above the default 1e-10, with the reason, per peer or per case.
DEFAULT_TOL = 1e-10
TOLERANCES: dict[str, tuple[float, str]] = {
    "liger": (1e-6, "Liger upcasts the logits to float32 inside each chunk"),
    "openrlhf:kl": (1e-6, "`compute_approx_kl` casts the log-probs to float32 (`.float()`)"),
    "openrlhf:adv[reinforce": (1e-6, "the batch whitening runs in float32 (`.float()`)"),
    "openrlhf:adv[gae]": (1e-6, "the batch whitening runs in float32 (`.float()`)"),
    "openrlhf:ppo_sample": (1e-8, "`aggregate_loss` adds 1e-8 to each row's token count"),
    "openrlhf:gspo": (1e-8, "`aggregate_loss` adds 1e-8 to each row's token count"),
    "verl:grpo_vectorized": (1e-6, "`group_mean_std` computes the group statistics in float32"),
    "verl:vanilla[seq-mean-token-mean]": (1e-8, "`agg_loss` adds 1e-8 to each row's token count"),
    "verl:gspo": (1e-8, "`agg_loss` adds 1e-8 to each row's token count"),
    "verl:sapo": (1e-8, "`agg_loss` adds 1e-8 to each row's token count"),
    "verl:geo_mean": (1e-8, "the row means add 1e-8 to each row's token count"),
    "verl:gdpo": (1e-6, "`gdpo` reads the rewards and weights as float32"),
    "verl:rpp": (1e-8, "`masked_mean` in `masked_whiten` adds 1e-8 to the count"),
    "verl:gae": (1e-8, "`masked_mean` in `masked_whiten` adds 1e-8 to the count"),
    "agilerl:grpo_window_fp32": (1e-6, "unpatched `_token_loss_weights` (float32 weights)"),
    "agilerl:grpo_micro_batch_fp32": (1e-6, "unpatched `_token_loss_weights` (float32 weights)"),
}
#: Outputs compared per case (default: every output the peer case returns).
ONLY = {
    "verl:clip_cov": ("grad",),  # the logged value differs by design (see the matrix cell)
    "verl:rpp_baseline": ("advantages",),
    "openrlhf:adv[reinforce_baseline]": ("advantages",),
}
#: Cases that differ by design on rows with a hole (a masked gap between valid tokens) and are
#: compared on the other rows only, for the per-row outputs named (the ``"design"`` cells' proof).
#: Empty since ``gap=`` reproduces OpenRLHF's and AgileRL's holes (issue 44).
DIFFERS: dict[str, tuple[str, tuple[str, ...]]] = {}

Cell = tuple[str, str, tuple[str, ...]]
NONE: Cell = ("none", "no counterpart", ())


def _n(text: str = "no counterpart") -> Cell:
    return ("none", text, ())


def _only(peer: str, status: str, text: str, cases: tuple[str, ...]) -> dict[str, Cell]:
    """A row whose only counterpart is ``peer``'s."""
    return {p: (status, text, cases) if p == peer else NONE for p in PEERS}


ALL_ROWS = "divides by every row, empty ones included; ours by rows with a valid token"

MATRIX: dict[str, dict[str, Cell]] = {
    # ------------------------------------------------------------------ rl_advantages
    "rl_advantages.group_relative": {
        "verl": (
            "args",
            '`eps=1e-6` (default); `scale="none"` for `norm_adv_by_std_in_grpo=False`. '
            "Group of one: verl's `grpo` and `grpo_vectorized` take mean 0, std 1 "
            "(A = r / (1 + eps)), ours 0 (differs by design: no baseline)",
            ("grpo", "grpo_vectorized", "grpo_nostd", "grpo_lone", "grpo_vectorized_lone"),
        ),
        "openrlhf": (
            "args",
            '`group_norm`: `eps=1e-9`; `dr_grpo`: `scale="none"`',
            ("adv[group_norm]", "adv[dr_grpo]"),
        ),
        "trl": ("args", '`eps=1e-4`; `scale_rewards`: `scale="batch"` / `"none"`', ()),
        "liger": _n("advantages come from the trainer"),
        "agilerl": (
            "args",
            '`eps=1e-8`; `adv_norm="mean_only"` is `scale="none"`',
            ("adv_mean_std", "adv_mean_only"),
        ),
    },
    "rl_advantages.group_relative_per_turn": {
        "verl": _n(),
        "openrlhf": _n(),
        "trl": _n(),
        "liger": _n(),
        "agilerl": (
            "args",
            "`fallback=` the trajectory advantage (AgileRL's lone-player rule), `eps=1e-8`",
            (),
        ),
    },
    "rl_advantages.rloo": {
        "verl": (
            "equal",
            "`rloo` and `rloo_vectorized`. Group of one: verl's loop `rloo` leaves "
            "A = r, ours 0 (differs by design: no baseline); `rloo_vectorized` gives 0 as ours",
            ("rloo", "rloo_vectorized", "rloo_lone", "rloo_vectorized_lone"),
        ),
        "openrlhf": ("equal", "`rloo` estimator (gamma forced to 1)", ("adv[rloo]",)),
        "trl": ("equal", "RLOOTrainer's leave-one-out baseline", ()),
        "liger": _n(),
        "agilerl": _n(),
    },
    "rl_advantages.gpg": _only("verl", "args", '`alpha="nonzero_rewards"`', ("gpg",)),
    "rl_advantages.opo": _only(
        "verl", "args", "`mask=lengths > 0` (verl keeps an empty row at weight 0)", ("opo",)
    ),
    "rl_advantages.pass_at_k": _only("verl", "equal", "`grpo_passk`", ("passk",)),
    "rl_advantages.gdpo": {
        **_only(
            "verl",
            "args",
            "`whiten(gdpo(rewards, G, weights=gdpo_reward_weights)` broadcast over the tokens "
            "`, mask)`",
            ("gdpo",),
        ),
        "trl": _n("read, not run (below)"),
    },
    "rl_advantages.max_rl": {p: _n("prime-rl's only: read, not run (below)") for p in PEERS},
    "rl_advantages.optimal_token_baseline": _only(
        "verl", "equal", "`optimal_token_baseline`", ("otb", "otb_is")
    ),
    "rl_advantages.remax": _only(
        "verl", "equal", "`remax` (valid tokens; verl leaves returns at masked tokens)", ("remax",)
    ),
    "rl_advantages.reinforce_plus_plus": {
        "verl": (
            "equal",
            '`reinforce_plus_plus`, any gamma (gaps skipped as ours: `gap="skip"`)',
            ("rpp", "rpp_gamma"),
        ),
        "openrlhf": (
            "args",
            '`unbiased=False, eps=0`; `gap="carry"` for gamma < 1 with gaps (OpenRLHF discounts '
            "across a masked gap, one step per masked token)",
            ("adv[reinforce]", "adv[reinforce_gamma]"),
        ),
        "trl": _n(),
        "liger": _n(),
        "agilerl": _n(),
    },
    "rl_advantages.reinforce_plus_plus_baseline": {
        "verl": (
            "equal",
            "`reinforce_plus_plus_baseline` (advantages; verl's returns are the centred scores)",
            ("rpp_baseline",),
        ),
        "openrlhf": ("args", "`unbiased=False, eps=0`", ("adv[reinforce_baseline]",)),
        "trl": _n(),
        "liger": _n(),
        "agilerl": _n(),
    },
    "rl_advantages.kl_in_reward": {
        "verl": ("equal", "`use_kl_in_reward` (score on the last token)", ()),
        "openrlhf": ("equal", "`compute_reward` (valid tokens)", ("reward",)),
        "trl": _n(),
        "liger": _n(),
        "agilerl": (
            "design",
            "AgileRL's single-turn REINFORCE writes the score on every token; "
            'ours on the last token (`broadcast_to_tokens(placement="all")` for theirs)',
            (),
        ),
    },
    "rl_advantages.gae": {
        "verl": (
            "args",
            "`whiten(gae(...).advantages, mask)`: verl whitens inside; gaps skipped as ours "
            '(`gap="skip"`, the default)',
            ("gae",),
        ),
        "openrlhf": (
            "args",
            '`gap="carry"` (a masked gap is a step with reward 0, value 0), '
            "`whiten(..., unbiased=False, eps=0)` of the advantages",
            ("adv[gae]",),
        ),
        "trl": _n("TRL's PPO is experimental; not compared"),
        "liger": _n(),
        "agilerl": (
            "args",
            '`gap="reset"` (token path `_compute_gae_returns_token`: a gap ends the episode, '
            "its `next_mask` zeroes the next value and `last_gae`), `whiten(...)` of the "
            "advantages unless `whiten_advantages=False`; its turn-level GAE is ours",
            ("gae_token", "gae_token_raw", "gae_token_dense", "gae_token_dense_raw"),
        ),
    },
    "rl_advantages.discounted_returns": {
        "verl": _n(),
        "openrlhf": (
            "args",
            '`gap="carry"` (`get_cumulative_returns` discounts every step, masked rewards 0; '
            "checked through `reinforce_plus_plus`)",
            ("adv[reinforce_gamma]",),
        ),
        "trl": _n(),
        "liger": _n(),
        "agilerl": (
            "args",
            '`gap="reset"` (token path: `next_mask` zeroes the carried return at a gap; checked '
            "through `rebn`); the turn-level returns are ours",
            ("rebn_token", "rebn_token_dense"),
        ),
    },
    "rl_advantages.rebn": {
        "verl": _n(),
        "openrlhf": _n(),
        "trl": _n(),
        "liger": _n(),
        "agilerl": (
            "equal",
            "REINFORCE's Return Batch Normalization; its token path "
            "`_compute_rebn_advantages_token` is "
            '`rebn(discounted_returns(..., gap="reset"), mask)`',
            ("rebn_token", "rebn_token_dense"),
        ),
    },
    "rl_advantages.whiten": {
        "verl": ("equal", "`masked_whiten`", ("rpp",)),
        "openrlhf": (
            "args",
            "`unbiased=False, eps=0` (`masked_normalize`; equal while var >= 1e-8)",
            ("whiten",),
        ),
        "trl": ("equal", "`masked_whiten`", ()),
        "liger": _n(),
        "agilerl": ("equal", "`masked_whiten`", ()),
    },
    "rl_advantages.overlong_penalty": {
        "verl": ("equal", "DAPO recipe's overlong buffer", ()),
        "openrlhf": ("equal", "`overlong_buffer_len` / `overlong_penalty_factor`", ()),
        "trl": ("equal", "`get_soft_overlong_punishment`", ()),
        "liger": _n(),
        "agilerl": _n(),
    },
    "rl_advantages.dynamic_sampling_mask": {
        "verl": ("equal", "DAPO recipe: keep groups with std > 0", ()),
        "openrlhf": (
            "design",
            "OpenRLHF keeps groups whose mean lies in a range; ours keeps groups "
            "whose valid rewards are not all equal (DAPO, arXiv 2503.14476, eq. 11)",
            (),
        ),
        "trl": _n("not supported in TRL"),
        "liger": _n(),
        "agilerl": ("equal", "`filter_zero_adv`", ()),
    },
    # ------------------------------------------------------------------ rl_losses
    "rl_losses.clipped_surrogate": {
        "verl": (
            "args",
            "`clip_low`, `clip_high`, `dual_clip=3.0` (`clip_ratio_c`); `aggregation` per "
            "`loss_agg_mode`",
            tuple(
                f"vanilla[{a}]"
                for a in (
                    "token-mean",
                    "seq-mean-token-mean",
                    "seq-mean-token-sum",
                    "seq-mean-token-sum-norm",
                )
            ),
        ),
        "openrlhf": (
            "args",
            'token mean; `token_level_loss=False`: `aggregation="seq_mean_token_mean"`; '
            "`dual_clip`; rollout correction through `is_weights`",
            ("ppo", "ppo_sample", "ppo_dual", "tis", "icepop", "seq_mask_tis"),
        ),
        "trl": (
            "args",
            "`dapo`/`bnpo`: token mean; `grpo`: `seq_mean_token_mean, normalizer=N`; "
            "`dr_grpo`: `seq_mean_token_sum_norm, normalizer=N, max_length=max_completion_length`; "
            "`delta`; off-policy mask and vLLM ratio as `is_weights`",
            ("grpo", "bnpo", "dr_grpo", "dapo", "dapo_delta", "dapo_off_policy", "dapo_vllm_is"),
        ),
        "liger": (
            "args",
            "as TRL (`grpo` with `normalizer=N`)",
            ("grpo", "bnpo", "dr_grpo", "dapo"),
        ),
        "agilerl": (
            "args",
            "`clip_low=c`; window token mean; `micro_batch`: `seq_mean_token_mean, normalizer=N`; "
            'turn / trajectory levels: `pooling="mean", unit_weight="tokens"`; masks and TIS as `is_weights`',
            (
                "grpo_window",
                "grpo_micro_batch",
                "grpo_window_fp32",
                "grpo_micro_batch_fp32",
                "grpo_masks",
                "grpo_vllm_tis",
                "turn",
                "trajectory",
            ),
        ),
    },
    "rl_losses.reinforce_loss": {
        "verl": ("equal", '`gpg` policy loss (`form="logprob"`)', ("gpg",)),
        "openrlhf": _n(),
        "trl": _n(),
        "liger": _n(),
        "agilerl": ("equal", "REINFORCE's policy-gradient term", ()),
    },
    "rl_losses.gspo_loss": {
        "verl": ("args", '`gradient="token", aggregation="seq_mean_token_mean"`', ("gspo",)),
        "openrlhf": ("args", '`aggregation="seq_mean_token_mean"` (sequence form)', ("gspo",)),
        "trl": (
            "args",
            '`importance_sampling_level="sequence"`: `gradient="token"` with `dapo`: '
            "token mean (each sequence weighs by its length); `grpo`: `seq_mean_token_mean, normalizer=N`",
            ("dapo_sequence", "grpo_sequence"),
        ),
        "liger": ("args", "as TRL", ("dapo_sequence",)),
        "agilerl": (
            "args",
            'trajectory level = `gradient="token", aggregation="token_mean"`',
            ("trajectory",),
        ),
    },
    "rl_losses.cispo_loss": {
        "verl": ("args", '`clamp="two_sided"`', ("cispo",)),
        "openrlhf": _n(),
        "trl": ("args", "`eps_high = epsilon_high - 1` (TRL's cap is absolute)", ("cispo",)),
        "liger": ("args", "as TRL", ("cispo",)),
        "agilerl": ("args", "`eps_high = clip_coef_max - 1` (upper clamp)", ("cispo",)),
    },
    "rl_losses.sapo_loss": {
        "verl": ("args", '`aggregation="seq_mean_token_mean"` (verl forces it)', ("sapo",)),
        "openrlhf": _n(),
        "trl": ("args", '`aggregation="seq_mean_token_mean", normalizer=N`', ("sapo",)),
        "liger": ("args", "as TRL", ("sapo",)),
        "agilerl": _n(),
    },
    "rl_losses.gmpo_loss": _only(
        "verl", "args", "`normalizer=N` (`geo_mean` " + ALL_ROWS + ")", ("geo_mean",)
    ),
    "rl_losses.clip_cov_loss": {
        "verl": (
            "design",
            "gradients equal (checked); the logged loss value differs: verl multiplies the detached "
            "tokens' loss by 0, ours keeps their (gradient-free) value in. verl also skips tokens "
            "its PPO clip already clipped, which have no gradient either way",
            ("clip_cov",),
        ),
        "openrlhf": _n(),
        "trl": _n(),
        "liger": _n(),
        "agilerl": _n(),
    },
    "rl_losses.kl_cov_loss": _only(
        "verl", "args", "`kl_cov_ratio`, `kl_coef=ppo_kl_coef`", ("kl_cov",)
    ),
    "rl_losses.dppo_loss": _only(
        "verl",
        "args",
        '`divergence="tv"` for `dppo_tv`, `"kl"` for `dppo_kl`; `delta_low=clip_ratio_low`, '
        "`delta_high=clip_ratio_high`, `ratio_cap=clip_ratio_c` (verl's default 3.0)",
        ("dppo_tv", "dppo_tv_cap", "dppo_kl"),
    ),
    "rl_losses.dro_loss": _only("verl", "args", "`beta=dro_beta` (`dro` policy loss)", ("dro",)),
    "rl_losses.luspo_loss": {
        "verl": _n("only in the LUSPO authors' verl fork"),
        "openrlhf": _n(),
        "trl": ("args", "`normalizer=N`, clip `epsilon`/`epsilon_high`", ("luspo",)),
        "liger": ("args", "as TRL", ("luspo",)),
        "agilerl": _n(),
    },
    "rl_losses.vespo_loss": {
        "verl": _n(),
        "openrlhf": _n(),
        "trl": (
            "equal",
            "`vespo` (without vLLM correction; with it TRL folds the ratio into w, ours "
            "keeps it a separate `is_weights` factor: differs by design)",
            ("vespo",),
        ),
        "liger": ("equal", "as TRL", ("vespo",)),
        "agilerl": _n(),
    },
    "rl_losses.kl_estimate": {
        "verl": (
            "args",
            '`low_var_kl`: `kind="k3", clamp=10`; `kl`/`mse`/`abs`: k1/k2/abs; `k3+`: '
            '`grad_kind="k2"`',
            ("kl[k3]", "kl[k1]", "kl[k2]", "kl[abs]"),
        ),
        "openrlhf": ("args", "`clamp=10`", ("kl[k1]", "kl[k2]", "kl[k3]")),
        "trl": ("equal", "k3", ("dapo_kl",)),
        "liger": ("equal", "k3", ("dapo_kl",)),
        "agilerl": ("equal", "k3", ("grpo_kl_plain",)),
    },
    "rl_losses.kl_penalty": {
        "verl": ("args", "as `kl_estimate`, `aggregation` per `loss_agg_mode`", ("kl[k3]",)),
        "openrlhf": (
            "args",
            '`unbiased_gradient=True`: `old_logprobs=..., importance_weight="gradient", '
            "weight_cap=10, clamp=10`",
            ("kl_unbiased",),
        ),
        "trl": (
            "args",
            '`use_bias_correction_kl` (token level): `old_logprobs=..., importance_weight="ratio"`; '
            'with `importance_sampling_level="sequence"` TRL weights by the sequence ratio (no argument: '
            "TRL notes it is not unbiased there)",
            ("dapo_kl", "dapo_kl_bias"),
        ),
        "liger": ("args", "as TRL", ("dapo_kl", "dapo_kl_bias")),
        "agilerl": (
            "args",
            '`clamp=10, clamp_mode="drop"` (`kl_clamp`); `use_bias_correction_kl`: '
            '`importance_weight="ratio"`; masked tokens: `is_weights=keep`',
            ("grpo_kl", "grpo_kl_plain", "grpo_masks"),
        ),
    },
    "rl_losses.value_loss": {
        "verl": ("args", "`clip=cliprange_value`", ("value",)),
        "openrlhf": ("args", "`clip=clip_eps`", ("value",)),
        "trl": _n("TRL's PPO is experimental; not compared"),
        "liger": _n(),
        "agilerl": ("args", "`clip=clip_coef`, times `vf_coef` outside", ()),
    },
    "rl_losses.entropy_bonus": {
        "verl": ("equal", "`entropy_coeff` (sign: ours returns the loss term)", ()),
        "openrlhf": _n(),
        "trl": ("equal", "`entropy_coef` (token mean)", ("dapo_entropy",)),
        "liger": _n(),
        "agilerl": _n(),
    },
    "rl_losses.high_entropy_mask": {
        "verl": _n(),
        "openrlhf": _n(),
        "trl": ("args", "`top_quantile=top_entropy_quantile`", ("high_entropy_mask",)),
        "liger": _n(),
        "agilerl": _n(),
    },
    "rl_losses.rollout_correction": {
        "verl": ("equal", "`rollout_is` token / sequence (product), threshold 2.0", ()),
        "openrlhf": (
            "args",
            'token `clip`: `mode="truncate", lower=low, cap=high`; `mask`: `mode="mask"`; '
            '`seq` mask: `level="sequence", statistic="geometric_mean", weights="token"`',
            ("tis", "icepop", "seq_mask_tis"),
        ),
        "trl": (
            "args",
            '`token_truncate`: `cap=3.0`; `sequence_mask`: `level="sequence", mode="mask", cap=3.0`',
            ("dapo_vllm_is",),
        ),
        "liger": _n("takes `vllm_is_ratio` from the trainer"),
        "agilerl": ("equal", "token TIS, cap 2.0", ("grpo_vllm_tis",)),
    },
    "rl_losses.off_policy_mask": {
        "verl": _n(),
        "openrlhf": _n(),
        "trl": (
            "args",
            "`sequence_threshold=off_policy_mask_threshold` with the sampler's log-probs, "
            "as `is_weights`",
            ("dapo_off_policy",),
        ),
        "liger": _n(),
        "agilerl": (
            "args",
            "`token_bounds`, `sequence_threshold`, as `is_weights` of the policy and KL terms",
            ("grpo_masks",),
        ),
    },
    "rl_losses.aggregate": {
        "verl": (
            "equal",
            "`agg_loss` (verl 0.9.1 `seq-mean-token-sum-norm` = ours, `max_length=loss_scale_factor`)",
            tuple(
                f"vanilla[{a}]"
                for a in (
                    "token-mean",
                    "seq-mean-token-mean",
                    "seq-mean-token-sum",
                    "seq-mean-token-sum-norm",
                )
            ),
        ),
        "openrlhf": ("equal", "`aggregate_loss`", ("ppo", "ppo_sample")),
        "trl": (
            "args",
            "`normalizer=N` for `grpo`/`sapo`/`dr_grpo`/`luspo` (TRL " + ALL_ROWS + ")",
            ("grpo", "dr_grpo", "sapo", "luspo"),
        ),
        "liger": ("args", "as TRL", ("grpo", "dr_grpo")),
        "agilerl": (
            "args",
            "`micro_batch`: `normalizer=N` (AgileRL " + ALL_ROWS + ")",
            ("grpo_micro_batch",),
        ),
    },
    **{
        f"rl_losses.{name}": {
            "verl": _n(),
            "openrlhf": _n(),
            "trl": _n(),
            "liger": _n(),
            "agilerl": _n(
                "AgileRL's ILQL is not an LLM fine-tuning path here; ours follows trlX, not compared"
            ),
        }
        for name in ("ilql_loss", "ilql_td_loss", "expectile_loss", "cql_loss", "awac_loss")
    },
    # ------------------------------------------------------------------ rl_kernels
    "rl_kernels.fused_policy_loss": {
        "verl": _n(),
        "openrlhf": _n(),
        "trl": _n(),
        "liger": (
            "args",
            "as `clipped_surrogate` / `cispo_loss` with Liger's `loss_type` mapping",
            ("dapo_kl#fused", "grpo#fused", "cispo#fused"),
        ),
        "agilerl": _n("AgileRL's fused path is Liger's kernel"),
    },
    "rl_kernels.liger_policy_loss": {
        "verl": _n(),
        "openrlhf": _n(),
        "trl": _n(),
        "liger": ("equal", "calls `LigerFusedLinearGRPOLoss` itself", ()),
        "agilerl": _n(),
    },
}
