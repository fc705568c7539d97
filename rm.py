"""
Reward model (Bradley–Terry). SPEC §3 "Reward model"; M14 §3–5.

    P(y_w ≻ y_l | x) = σ(r_φ(x, y_w) − r_φ(x, y_l))
    L_RM = −log σ(r_φ(x, y_w) − r_φ(x, y_l))            one term per pair, count = pairs

r_φ is the language model with a scalar head (ScalarHeadGPT), read at the last response token (the
end token), where causal attention has seen the whole prompt and answer (rollouts.score_responses).
Only differences of r_φ are learnt: its offset is arbitrary. The checkpoint (kind "scalar") is
what lab/ppo_rm.py (and online DPO's rm labeler) loads as its reward model, through checkpoints.load_model.

    python train.py --algo rm --init_from=out/sft

The preference pairs (sampled by the init_from model and labelled by the verifier, or a style
preference, or a file) come from pairs.py, which dpo.py shares.
"""

from types import SimpleNamespace

import torch
import torch.nn.functional as F

from nanopost import pairs
from nanopost.checkpoints import load_reference
from nanopost.distributed import all_reduce_sum, chunks
from nanopost.evaluation import write_samples
from model import ScalarHeadGPT
from nanopost.passports import preference_passport, write_passport
from nanopost.rollouts import score_responses

starts_from = {"init_from": "sft"}  # scores answers of the SFT policy's kind: no random start (options.check_start)
defaults = dict(pairs.PAIR_DEFAULTS, train_prompts=2048,  # more pairs: the RM overfits 512 prompts' pairs
                learning_rate=3e-4, min_lr=3e-5, warmup_iters=10, max_iters=150, eval_interval=50)


# ----------------------------------------------------------------------------------------------
# Bradley–Terry and the loss

def bradley_terry(reward_margin):
    """P(y_w ≻ y_l) = σ(r_w − r_l)."""
    return torch.sigmoid(reward_margin)


def bradley_terry_margin(win_rate):
    """The inverse: the margin r_w − r_l that a win rate p implies, log(p / (1 − p))."""
    return torch.logit(win_rate)


def pair_rewards(model, batch):
    """(r_w, r_l) of a collated batch of pairs (pairs.collate), from one forward over chosen and rejected rows."""
    rewards = score_responses(model, batch["ids"], batch["mask"])
    return rewards.chunk(2)


def loss(run, state, model, batch):
    r_w, r_l = pair_rewards(model, batch)
    losses = F.softplus(-(r_w - r_l))  # −log σ(r_w − r_l), stable for any margin
    r_w, r_l = r_w.detach(), r_l.detach()
    with torch.no_grad():  # tensors: the loop reads them once per step (no host sync per micro-batch)
        metrics = dict(pair_acc=(r_w > r_l).float().mean(), margin=(r_w - r_l).mean(), reward_chosen=r_w.mean(),
                       reward_rejected=r_l.mean(), tokens=batch["mask"].sum())
    return losses.sum(), len(losses), metrics


# ----------------------------------------------------------------------------------------------
# The algorithm module interface (see train.py)

def wrap_model(run, model):
    return model if isinstance(model, ScalarHeadGPT) else ScalarHeadGPT(model)


def setup(run, saved):
    """The pairs: from --data, or sampled by the starting policy (π_ref, frozen) and labelled."""
    reference = load_reference(run) if not run.cfg["data"] else None
    train_pairs, heldout_pairs, skipped = pairs.load_preferences(run, reference)
    write_samples(run, 0, [pairs.describe(run, ex) for ex in train_pairs[:4]])
    write_passport(run, preference_passport(run, "a Bradley–Terry reward model: −log σ(r(x, y_w) − r(x, y_l)) on "
                                                 "a scalar head read at the last response token", references="none"))
    return SimpleNamespace(train_pairs=train_pairs, heldout_pairs=heldout_pairs, skipped_rows=skipped)


def batches(run, state, it):
    return pairs.step_batches(run, it, state.train_pairs), {}


@torch.no_grad()
def evaluate(run, state, it):
    """Held-out pairwise accuracy, mean margin and loss."""
    model = run.raw_model
    sums = dict(correct=0.0, margin=0.0, loss=0.0, pairs=0.0)
    with run.autocast:
        for chunk in chunks(state.heldout_pairs[run.rank::run.world_size], run.cfg["eval_batch_size"]):
            r_w, r_l = pair_rewards(model, pairs.collate(run, chunk))
            margin = r_w - r_l
            sums["correct"] += float((margin > 0).sum())
            sums["margin"] += float(margin.sum())
            sums["loss"] += float(F.softplus(-margin).sum())
            sums["pairs"] += len(margin)
    sums = all_reduce_sum(sums, run)
    n = sums["pairs"]
    return dict(val_pair_acc=sums["correct"] / n, val_margin=sums["margin"] / n, val_loss=sums["loss"] / n,
                val_pairs=n)  # (the size of the accuracy's noise band)
