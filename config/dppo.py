# DPPO (divergence proximal policy optimisation, Qi et al. 2026; prime-rl's default loss): no clip on the
# ratio; a token whose probability moved more than δ = 0.1 from π_old's, in the direction its advantage
# pushes, is dropped from the loss (a Binary-TV trust region); ρ·A on the others, no KL term (lab/dppo.py).
#   python train.py config/dppo.py --init_from=out/sft
algo = "dppo"
tv_delta = 0.1
kl_coef = 0.0
