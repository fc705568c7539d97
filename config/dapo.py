# DAPO: Clip-Higher (clip_eps_high > clip_eps), dynamic sampling (drop all-correct / all-wrong groups and
# refill the batch), token-level loss, soft overlong penalty, no KL term (lab/dapo.py).
#   python train.py config/dapo.py --init_from=out/sft
algo = "dapo"
clip_eps, clip_eps_high = 0.2, 0.28
kl_coef = 0.0
dynamic_sampling_rounds = 3     # at most 3 extra rollouts of a shard to find informative groups
overlong_cache = 16             # penalty ramps from 0 to -1 over the last 16 of max_new_tokens
