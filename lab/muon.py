"""Muon, momentum orthogonalised by Newton–Schulz (Jordan et al. 2024, "Muon: an optimizer for hidden
layers", kellerjordan.github.io/posts/muon; at scale: Liu et al. 2025, "Muon is Scalable for LLM Training",
arXiv:2502.16982): SFT or pre-training (--pretrain=True) with another optimiser, nothing else changed.
Every 2-D weight of the transformer blocks (attention and MLP matrices) steps along its momentum made
orthogonal; the embeddings, the head, the norms and the biases keep AdamW. For a matrix W (m × n):

    B_t = μ·B_{t−1} + G_t                      momentum of the gradient G_t
    U_t = G_t + μ·B_t                          Nesterov's look-ahead
    O_t = NS5(U_t / ‖U_t‖_F) ≈ U V^T           (U S V^T = U_t: every singular value pushed towards 1)
    W  ← W − lr·(0.2·√max(m, n)·O_t + λ·W)

NS5: five steps of X ← a·X + b·(X X^T)X + c·(X X^T)^2 X, (a, b, c) = (3.4445, −4.7750, 2.0315), the
quintic Jordan tuned to drive small singular values up fast (they end in about [0.7, 1.2], not exactly 1).
The factor 0.2·√max(m, n) is Moonlight's: it gives the update the RMS of AdamW's (about 0.2), so one
learning rate, schedule and weight decay serve both kinds of weight, and the loop sets them as for AdamW.

One optimiser holds both kinds (param groups with `muon` True or False), so the checkpoint keeps its
state (momentum buffers; AdamW's moments and step) and a resumed run continues exactly. Under DDP every
rank steps the same all-reduced gradient, so the weights stay equal; --fsdp is refused (a shard is not
the matrix NS5 must see whole). Everything else is sft.py's (--pretrain=True: as --algo pretrain).

    python train.py --algo muon                                   # SFT on the default task
    python train.py --algo muon --pretrain=True --max_iters=200   # pre-training on the task's corpus
"""

import math

import torch

import sft
from sft import batches, evaluate, loss, setup  # noqa: F401  (what Muon does not change)

base = "sft"
defaults = dict(
    sft.defaults,
    pretrain=False,        # True: pre-training (as --algo pretrain: the environment's corpus, every token in the loss)
    muon_momentum=0.95,    # μ: the momentum of the orthogonalised matrices' gradient (Nesterov)
)
NS_COEFFICIENTS, NS_STEPS = (3.4445, -4.7750, 2.0315), 5


def make_optimizer(run, model):
    """Muon for the blocks' 2-D weights, AdamW (as train.py's) for every other trainable weight."""
    cfg = run.cfg
    if run.fsdp:
        raise ValueError("--algo muon with --fsdp is not supported: Muon orthogonalises each matrix whole, and "
                         "FSDP holds it in shards; drop --fsdp")
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    matrix = [p for name, p in named if p.dim() == 2 and ".h." in f".{name}"]  # (transformer.h.N...: the blocks)
    chosen = {id(p) for p in matrix}
    rest = [p for name, p in named if id(p) not in chosen]
    return Muon([dict(params=matrix, muon=True, weight_decay=cfg["weight_decay"]),
                 dict(params=[p for p in rest if p.dim() >= 2], muon=False, weight_decay=cfg["weight_decay"]),
                 dict(params=[p for p in rest if p.dim() < 2], muon=False, weight_decay=0.0)],
                lr=cfg["learning_rate"], momentum=cfg["muon_momentum"], betas=(cfg["beta1"], cfg["beta2"]))


def newton_schulz(update):
    """NS5(U/‖U‖_F): an approximately orthogonal matrix with U's singular vectors (fp32; a wide matrix
    is iterated transposed, so X X^T is the smaller Gram matrix)."""
    a, b, c = NS_COEFFICIENTS
    x = update.float()
    tall = x.size(0) > x.size(1)
    if tall:
        x = x.T
    x = x / (x.norm() + 1e-7)
    for _ in range(NS_STEPS):
        gram = x @ x.T
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.T if tall else x


class Muon(torch.optim.Optimizer):
    """The two updates of the docstring, one per kind of param group (`muon`: True or False)."""

    def __init__(self, groups, lr, momentum, betas, eps=1e-8):
        super().__init__(groups, dict(lr=lr, momentum=momentum, betas=betas, eps=eps))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in (p for p in group["params"] if p.grad is not None):
                if group["muon"]:
                    muon_step(p, self.state[p], group)
                else:
                    adamw_step(p, self.state[p], group)


def muon_step(p, state, group):
    """W ← W·(1 − lr·λ) − lr·0.2·√max(m, n)·NS5(G + μ·B), B ← μ·B + G."""
    if "momentum_buffer" not in state:
        state["momentum_buffer"] = torch.zeros_like(p)
    buffer, mu = state["momentum_buffer"], group["momentum"]
    buffer.mul_(mu).add_(p.grad)
    orthogonal = newton_schulz(p.grad + mu * buffer)
    p.mul_(1 - group["lr"] * group["weight_decay"])
    p.add_(orthogonal.to(p.dtype), alpha=-group["lr"] * 0.2 * math.sqrt(max(p.shape)))


def adamw_step(p, state, group):
    """AdamW (Loshchilov & Hutter 2019), as torch.optim.AdamW: decoupled decay, bias-corrected moments."""
    if "step" not in state:
        state.update(step=torch.zeros(()), exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
    (beta1, beta2), lr = group["betas"], group["lr"]
    state["step"] += 1
    t = float(state["step"])
    state["exp_avg"].lerp_(p.grad, 1 - beta1)
    state["exp_avg_sq"].mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
    p.mul_(1 - lr * group["weight_decay"])
    denom = (state["exp_avg_sq"] / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
    p.addcdiv_(state["exp_avg"], denom, value=-lr / (1 - beta1 ** t))
