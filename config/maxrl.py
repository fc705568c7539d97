# MaxRL (maximum likelihood RL, Tajwar et al. 2026): GRPO with the group's advantage divided by its mean
# reward instead of its std, A_i = (r_i - mean)/mean, so that the gradient follows the log of each prompt's
# success probability (up-weighting hard prompts); everything else grpo.py's, its KL term included (lab/maxrl.py).
#   python train.py config/maxrl.py --init_from=out/sft
algo = "maxrl"
clip_eps = 0.2
kl_coef = 0.04
