# The README's preference demo: both kinds of built-in pairs (verifier-labelled and style-only),
# so that a loss's effect on correctness and on length can both be seen.
#   python train.py --algo dpo config/dpo.py --init_from=out/sft      # or --algo ipo | kto | simpo | orpo (lab/)
pairs = "both"
