# DAPO: Clip-Higher (eps_high > eps_low), dynamic sampling (drop all-correct / all-wrong groups and
# refill the batch), token-level loss, soft overlong penalty, no KL term.
#   python train.py --algo grpo config/dapo.py --init_from=out/sft
algo = "grpo"
estimator = "grpo"
loss_agg = "token_mean"
eps_low, eps_high = 0.2, 0.28
kl = "off"
on_degenerate = "drop"
dynamic_sampling_rounds = 3     # at most 3 extra rollouts of a shard to find informative groups
overlong_cache = 16             # penalty ramps from 0 to -1 over the last 16 of max_new_tokens
