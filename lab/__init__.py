"""
The lab: every variant of an algorithm is its own file here, chosen by name (`python train.py --algo
NAME`). A variant imports the plain algorithm it changes (its `base`: grpo, dpo, ppo, opd) and shows
only what it changes, with its formula and its paper; everything it does not define is the base's.
"""
