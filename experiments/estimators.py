"""
The estimator lab (docs/policy-gradient.md): a policy small enough that every response can be
enumerated, so the true policy gradient, the true KL and the KL-regularised optimum are exact
numbers, and each Monte Carlo estimator of grpo.py can be held against them.

The toy: tokens a, b and an end token; a response is up to L = 4 tokens (k ≤ 3 of a/b then the
end token, or 4 of a/b, truncated): 31 responses. The policy is tabular and autoregressive: one
logit vector per prefix (15 prefixes × 3), so it can represent any distribution over the 31. The
reward is the verifier's 0/1: more a's than b's, then the end token. π_ref has logits N(0, 1), π_θ
those plus N(0, 1), π_old (the off-policy sampler) π_θ's plus N(0, 0.3).

Estimators of ∇J(θ), J = E_π[r], each from groups of G responses (the batch), repeated --trials times;
each per-token weight comes from grpo.py's and its lab's own advantages and loss pieces
(grpo.group_advantages, model.clipped_surrogate, lab/rloo, dr_grpo, gspo, cispo, dapo):
    reinforce     r_i · Σ_t ∇log π (no baseline)                      unbiased
    rloo          leave-one-out baseline, Σ_t                           unbiased
    grpo          (r − mean)/std, per-response token mean               std and length normalisation
    dr_grpo       r − mean, Σ_t / L_max                                 (G − 1)/G · ∇J / L_max
    gspo, cispo   GRPO's advantages with GSPO's sequence ratio / CISPO's capped weights (at ρ = 1: grpo
                  and a token-mean REINFORCE)
    maxrl         (r − mean)/mean, per-response token mean (lab/maxrl.py); maxrl_token_sum: Σ_t, whose
                  expectation is exactly ∇ of the truncated likelihood −Σ_{k<G} (1 − p)^k/k (printed)
    sapo, dppo    GRPO's advantages with SAPO's soft gate / DPPO's divergence mask (at ρ = 1: grpo)
Off-policy (samples from π_old): sequence IS (Π_t ρ_t · r, unbiased), grpo (token clip 0.2), gspo
(sequence clip 3e-4 / 4e-4), cispo (weight capped at 1.28, token mean), sapo (gate τ = 1 / 1.05), dppo
(|π_θ − π_old| ≤ 0.1 in the advantage's direction).
For each: scale = ⟨E ĝ, ∇J⟩ / ‖∇J‖² (what it does to the step size), cos(E ĝ, ∇J) (1 = unbiased
direction), relative bias ‖E ĝ/scale − ∇J‖ / ‖∇J‖, and relative std √(E‖ĝ − E ĝ‖²) / (scale·‖∇J‖)
per batch (the noise at the same expected step: a constant factor changes no estimator's quality). The KL estimators k1 = log(π/π_ref), k2 = ½ log²(π/π_ref), k3 = π_ref/π − 1 − log(π_ref/π),
summed over a response's tokens, against the exact KL(π‖π_ref); and, exactly by enumeration, the
gradient of k3 used as a loss against ∇KL(π‖π_ref). Last, the KL-regularised optimum
π* ∝ π_ref · exp(r/β) (DPO's closed form) by enumeration, and exact gradient ascent on
E_π[r] − β·KL(π‖π_ref) from π_ref converging to it.

    python experiments/estimators.py                       # 20,000 batches of G = 8, table + plot
    python experiments/estimators.py --quick               # 2,000 batches (the test)
    python experiments/estimators.py --group_size=4 --out=docs/img
"""

import argparse
import itertools
import json
import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import grpo  # noqa: E402  (after the path: the script runs from anywhere)
from lab import cispo, dapo, dppo, dr_grpo, gspo, maxrl, rloo, sapo  # noqa: E402
from experiments.study import pyplot, save_figure  # noqa: E402
from model import clipped_surrogate, kl_estimate  # noqa: E402

A, B, END, L = 0, 1, 2, 4


def enumerate_responses():
    """Every response as a token list, and the prefixes (the policy's states) in a fixed order."""
    ys = [list(p) + [END] for k in range(L) for p in itertools.product((A, B), repeat=k)]
    ys += [list(p) for p in itertools.product((A, B), repeat=L)]
    prefixes = [p for k in range(L) for p in itertools.product((A, B), repeat=k)]
    return ys, {p: i for i, p in enumerate(prefixes)}


RESPONSES, PREFIX = enumerate_responses()
Y = len(RESPONSES)
STATE = torch.tensor([[PREFIX[tuple(y[:t])] if t < len(y) else 0 for t in range(L)] for y in RESPONSES])
TOKEN = torch.tensor([[y[t] if t < len(y) else 0 for t in range(L)] for y in RESPONSES])
MASK = torch.tensor([[1.0 if t < len(y) else 0.0 for t in range(L)] for y in RESPONSES])
REWARD = torch.tensor([1.0 if y.count(A) > y.count(B) and y[-1] == END else 0.0 for y in RESPONSES])


def token_logprobs(theta):
    """(Y, L) log π(y_t | y_<t) of every response, 0 past its end."""
    return torch.log_softmax(theta, -1)[STATE, TOKEN] * MASK


def seq_logprobs(theta):
    return token_logprobs(theta).sum(1)


def expected_reward(theta):
    return (seq_logprobs(theta).exp() * REWARD).sum()


def exact_kl(theta, ref):
    p = seq_logprobs(theta).exp()
    return (p * (seq_logprobs(theta) - seq_logprobs(ref))).sum()


def flat_grad(f, theta):
    theta = theta.detach().requires_grad_(True)
    return torch.autograd.grad(f(theta), theta)[0].flatten()


def jacobian(theta):
    """(Y·L, |θ|): ∇_θ log π(y_t | y_<t) for every response token."""
    return torch.autograd.functional.jacobian(token_logprobs, theta).reshape(Y * L, -1)


def surrogate(ratio=grpo.token_ratio, eps=(0.2, 0.2), kind="clip"):
    """The per-token policy term (logp, old_logp, advantages (N,), mask) -> (N, L): the ratio (GRPO's token
    ratio, GSPO's sequence ratio) in the clipped surrogate (kind "clip"), in CISPO's capped weight ("cispo"),
    SAPO's soft gate ("sapo": its recipe's τ) or DPPO's divergence mask ("dppo": its recipe's δ)."""
    def per_token(logp, old_logp, adv, mask):
        on = mask > 0
        rho = ratio(logp, old_logp, on)
        if kind == "cispo":
            return cispo.cispo_surrogate(rho, adv[:, None], logp, on, *eps)[0]
        if kind == "sapo":
            return sapo.sapo_surrogate(rho, adv[:, None], on, sapo.defaults["sapo_tau_pos"], sapo.defaults["sapo_tau_neg"])[0]
        if kind == "dppo":
            return dppo.dppo_surrogate(rho, adv[:, None], logp, old_logp, on, dppo.defaults["tv_delta"])[0]
        return clipped_surrogate(rho, adv[:, None], on, *eps)[0]
    return per_token


group = lambda advantages: lambda r: advantages(r.flatten(), r.size(1))  # (K, G) rewards -> (K·G,) advantages
sum_over = lambda max_len: lambda per_token, mask: dr_grpo.seq_mean_token_sum_norm(per_token, mask, max_len)
ESTIMATORS = dict(  # name: (advantages from (K, G) rewards, the per-token term, the aggregation) of grpo.py and its lab
    reinforce=(lambda r: r.flatten(), surrogate(), sum_over(1)),
    rloo=(group(rloo.leave_one_out_advantages), surrogate(), sum_over(1)),
    grpo=(group(grpo.group_advantages), surrogate(), grpo.seq_mean_token_mean),
    dr_grpo=(group(dr_grpo.centred_advantages), surrogate(), sum_over(L)),
    gspo=(group(grpo.group_advantages), surrogate(gspo.sequence_ratio, (3e-4, 4e-4)), grpo.seq_mean_token_mean),
    cispo=(group(grpo.group_advantages), surrogate(eps=(1.0, 0.28), kind="cispo"), dapo.token_mean),
    maxrl=(group(maxrl.mean_normalised_advantages), surrogate(), grpo.seq_mean_token_mean),
    maxrl_token_sum=(group(maxrl.mean_normalised_advantages), surrogate(), sum_over(1)),
    sapo=(group(grpo.group_advantages), surrogate(kind="sapo"), grpo.seq_mean_token_mean),
    dppo=(group(grpo.group_advantages), surrogate(kind="dppo"), grpo.seq_mean_token_mean),
)
OFF_POLICY = ("seq_is", "grpo", "gspo", "cispo", "sapo", "dppo")


def batch_gradients(theta, old, draws, name):
    """(K, |θ|) gradient estimates of J, one per batch of G responses (draws: (K, G) response
    indices sampled from π_old), through the loss's per-token weights."""
    K, G = draws.shape
    rows = draws.flatten()
    mask = MASK[rows]
    rewards = REWARD[draws]
    logp = token_logprobs(theta).detach()[rows].requires_grad_(True)
    old_logp = token_logprobs(old).detach()[rows]
    if name == "seq_is":  # Π_t ρ_t · r · Σ_t ∇log π: the unbiased off-policy REINFORCE
        weight = ((logp - old_logp) * mask).sum(1).exp().detach() * rewards.flatten()
        coeff, per_batch = weight[:, None] * mask, torch.full((K,), float(G))
    else:
        advantages, per_token, aggregate = ESTIMATORS[name]
        loss_sum, _ = aggregate(per_token(logp, old_logp, advantages(rewards), mask), mask)
        coeff = -torch.autograd.grad(loss_sum, logp)[0]
        per_batch = mask.view(K, -1).sum(1) if aggregate is dapo.token_mean else torch.full((K,), float(G))
    coeff = coeff / per_batch.repeat_interleave(G)[:, None]
    weights = torch.zeros(K, Y, L).index_put_((torch.arange(K).repeat_interleave(G), rows), coeff, accumulate=True)
    return weights.reshape(K, Y * L) @ jacobian(theta)


def summary(estimates, truth):
    """scale, cos, relative bias (after the scale) and relative std of (K, |θ|) estimates, and the
    Monte Carlo error of the relative bias (what an unbiased estimator's shows: the noise of the mean)."""
    mean, norm = estimates.mean(0), truth.norm()
    scale = float(mean @ truth / norm ** 2)
    cos = float(mean @ truth / (mean.norm() * norm).clamp(min=1e-30))
    bias = float((mean / scale - truth).norm() / norm) if scale != 0 else float("nan")
    std = float(((estimates - mean) ** 2).sum(1).mean().sqrt() / norm) / abs(scale)  # at the same expected step
    return dict(scale=scale, cos=cos, rel_bias=bias, rel_std=std, mc_se=std / math.sqrt(len(estimates)))


def maxrl_expected_gradient(theta, G):
    """E[ĝ] of MaxRL's estimator with the token sum, ĝ = (1/G) Σ_i A_i Σ_t ∇log π(y_it), exactly: by symmetry
    G·E[(r_1/K − 1/G)·∇log π(y_1)] (0 where K = 0), K = r_1 + Binomial(G − 1, p) successes, enumerated."""
    p = float(expected_reward(theta))
    binomial = torch.tensor([math.comb(G - 1, b) * p ** b * (1 - p) ** (G - 1 - b) for b in range(G)], dtype=torch.float64)
    b = torch.arange(G, dtype=torch.float64)
    weight_success = float((binomial / (1 + b)).sum()) - 1 / G
    weight_failure = -float(binomial[1:].sum()) / G  # (an all-fail group: A = 0)
    weight = torch.where(REWARD > 0, weight_success, weight_failure)
    prob = seq_logprobs(theta).exp().detach()
    return G * ((weight * prob)[:, None] * MASK).reshape(-1).float() @ jacobian(theta)


def maxrl_rows(theta, G):
    """MaxRL's expected gradient (token sum, exact) against ∇ of the truncated likelihood
    J_M = −Σ_{k=1}^{M} (1 − p)^k / k for M = G − 1 and M = G, and against ∇log p (M → ∞): ‖E ĝ − ∇J_M‖ / ‖∇J_M‖."""
    expected, p = maxrl_expected_gradient(theta, G), expected_reward(theta)
    out = dict(reward=float(p))
    for name, M in (("truncated_G_minus_1", G - 1), ("truncated_G", G), ("log_likelihood", None)):
        objective = ((lambda t: torch.log(expected_reward(t))) if M is None else
                     (lambda t, M=M: -sum((1 - expected_reward(t)) ** k / k for k in range(1, M + 1))))
        target = flat_grad(objective, theta)
        out[f"rel_diff_to_{name}"] = float((expected - target).norm() / target.norm())
    return out


def kl_rows(theta, ref, draws):
    """Single-response KL estimates (summed over tokens) against the exact KL, and the gradient of
    k3-as-a-loss in expectation (exact) against ∇KL(π‖π_ref)."""
    truth = float(exact_kl(theta, ref))
    lp, ref_lp = token_logprobs(theta)[draws.flatten()], token_logprobs(ref)[draws.flatten()]
    mask = MASK[draws.flatten()]
    prob = seq_logprobs(theta).exp().detach()
    lp_all, ref_all = token_logprobs(theta).detach(), token_logprobs(ref).detach()
    out = {}
    for k, f in (("k1", lambda p, q: kl_estimate(p, q, "k1")), ("k2", lambda p, q: 0.5 * (p - q) ** 2),
                 ("k3", lambda p, q: kl_estimate(p, q, "k3"))):
        per = (f(lp, ref_lp) * mask).sum(1)
        expected = float((prob * (f(lp_all, ref_all) * MASK).sum(1)).sum())  # E_π by enumeration: no MC noise
        out[k] = dict(expected=expected, exact=truth, bias=expected - truth, mean=float(per.mean()),
                      std=float(per.std()), mc_se=float(per.std()) / math.sqrt(len(per)))
    # E_π[Σ_t ∇k3_t] exactly: the per-token weight ∂k3/∂log π = 1 − π_ref/π, summed under π
    weight = (1 - torch.exp(ref_all - lp_all)) * MASK * prob[:, None]
    k3_grad = weight.reshape(-1) @ jacobian(theta)
    true_grad = flat_grad(lambda t: exact_kl(t, ref), theta)
    reverse = flat_grad(lambda t: (seq_logprobs(ref).exp() * (seq_logprobs(ref) - seq_logprobs(t))).sum(), theta)
    out["k3_loss_gradient"] = dict(rel_diff_to_grad_kl=float((k3_grad - true_grad).norm() / true_grad.norm()),
                                   rel_diff_to_grad_reverse_kl=float((k3_grad - reverse).norm() / reverse.norm()))
    return out


def kl_regularised_optimum(ref, beta, steps, lr):
    """π* ∝ π_ref·exp(r/β) by enumeration against exact gradient ascent on E[r] − β·KL(π‖π_ref)
    from π_ref: the objective's value at each and KL(π_trained‖π*)."""
    ref_lp = seq_logprobs(ref)
    log_z = torch.logsumexp(ref_lp + REWARD / beta, 0)
    star = ref_lp + REWARD / beta - log_z
    objective = lambda t: expected_reward(t) - beta * exact_kl(t, ref)
    theta = ref.clone()
    for _ in range(steps):  # plain gradient ascent on the exact objective
        theta = theta + lr * flat_grad(objective, theta).view_as(theta)
    lp = seq_logprobs(theta).detach()
    return dict(beta=beta, beta_log_z=float(beta * log_z), objective_at_trained=float(objective(theta.detach())),
                kl_trained_to_optimum=float((lp.exp() * (lp - star)).sum()), reward_at_optimum=float((star.exp() * REWARD).sum()),
                reward_at_reference=float((ref_lp.exp() * REWARD).sum()),
                kl_optimum_to_reference=float((star.exp() * (star - ref_lp)).sum()))


def run_lab(trials, group_size, seed):
    g = torch.Generator().manual_seed(seed)
    ref = torch.randn(len(PREFIX), 3, generator=g)
    theta = ref + torch.randn(ref.shape, generator=g)
    old = theta + 0.3 * torch.randn(ref.shape, generator=g)
    truth = flat_grad(expected_reward, theta)
    sample = lambda t: torch.multinomial(seq_logprobs(t).exp().detach(), trials * group_size, replacement=True,
                                         generator=g).view(trials, group_size)
    on, off = sample(theta), sample(old)
    results = dict(on_policy={name: summary(batch_gradients(theta, theta, on, name), truth) for name in ESTIMATORS},
                   off_policy={name: summary(batch_gradients(theta, old, off, name), truth) for name in OFF_POLICY},
                   maxrl=maxrl_rows(theta, group_size),
                   kl=kl_rows(theta, ref, on), optimum=kl_regularised_optimum(ref, beta=0.5, steps=1000, lr=3.0),
                   settings=dict(trials=trials, group_size=group_size, seed=seed, responses=Y,
                                 true_gradient_norm=float(truth.norm()), reward=float(expected_reward(theta)),
                                 reward_old=float(expected_reward(old))))
    return results


def print_tables(res):
    s = res["settings"]
    print(f"toy: {s['responses']} responses, J(θ) = {s['reward']:.4f}, ‖∇J‖ = {s['true_gradient_norm']:.4f}, "
          f"{s['trials']} batches of G = {s['group_size']}")
    for setting in ("on_policy", "off_policy"):
        print(f"\n{setting.replace('_', '-')} | scale | cos | rel. bias | rel. std per batch | MC s.e.")
        print("|---|---|---|---|---|---|")
        for name, r in res[setting].items():
            print(f"| {name} | {r['scale']:.4f} | {r['cos']:.4f} | {r['rel_bias']:.4f} | {r['rel_std']:.3f} | {r['mc_se']:.4f} |")
    print("\nKL estimator (one response) | E (exact) | KL(π‖π_ref) | bias | MC mean | std")
    print("|---|---|---|---|---|---|")
    for k in ("k1", "k2", "k3"):
        r = res["kl"][k]
        print(f"| {k} | {r['expected']:.4f} | {r['exact']:.4f} | {r['bias']:+.4f} | {r['mean']:.4f} | {r['std']:.4f} |")
    g = res["kl"]["k3_loss_gradient"]
    print(f"\nk3 as a loss, exact expected gradient: ‖E∇k3 − ∇KL(π‖π_ref)‖/‖∇KL‖ = {g['rel_diff_to_grad_kl']:.4f}, "
          f"against ∇KL(π_ref‖π): {g['rel_diff_to_grad_reverse_kl']:.4f}")
    m = res["maxrl"]
    print(f"\nMaxRL (token sum), exact expected gradient: ‖E ĝ − ∇J_M‖/‖∇J_M‖ = {m['rel_diff_to_truncated_G_minus_1']:.2e} "
          f"at M = G − 1, {m['rel_diff_to_truncated_G']:.4f} at M = G, {m['rel_diff_to_log_likelihood']:.4f} against ∇log p "
          f"(p = {m['reward']:.4f})")
    o = res["optimum"]
    print(f"KL-regularised optimum (β = {o['beta']}): β·log Z = {o['beta_log_z']:.6f}, objective after exact "
          f"ascent {o['objective_at_trained']:.6f}, KL(trained‖π*) = {o['kl_trained_to_optimum']:.2e}; reward "
          f"{o['reward_at_reference']:.4f} at π_ref -> {o['reward_at_optimum']:.4f} at π* (KL to π_ref {o['kl_optimum_to_reference']:.4f})")


def plot(res, path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, setting in zip(axes[:2], ("on_policy", "off_policy")):
        names = list(res[setting])
        x = torch.arange(len(names)).float()
        ax.bar(x - 0.2, [res[setting][n]["rel_bias"] for n in names], 0.4, label="relative bias (direction)")
        ax.bar(x + 0.2, [res[setting][n]["rel_std"] for n in names], 0.4, label="relative std per batch")
        ax.set_xticks(x.tolist(), names, rotation=30)
        ax.set_title(setting.replace("_", "-") + " gradient estimators")
        ax.set_yscale("log")
        ax.legend(fontsize=8)
    kl = res["kl"]
    axes[2].bar(["k1", "k2", "k3"], [kl[k]["expected"] for k in ("k1", "k2", "k3")],
                yerr=[kl[k]["std"] for k in ("k1", "k2", "k3")], capsize=4)
    axes[2].axhline(kl["k1"]["exact"], color="k", linestyle="--", label="exact KL(π‖π_ref)")
    axes[2].set_title("KL estimators (one response): E ± std")
    axes[2].legend(fontsize=8)
    save_figure(fig, path, dpi=110)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=20000, help="Monte Carlo batches per estimator")
    parser.add_argument("--group_size", type=int, default=8, help="G: responses per batch (one prompt's group)")
    parser.add_argument("--seed", type=int, default=0, help="seeds the toy's logits and the draws")
    parser.add_argument("--quick", action="store_true", help="2,000 batches (the test's size)")
    parser.add_argument("--out", default="", help="a directory for estimators.json and estimators.png ('' = print only)")
    args = parser.parse_args(argv)
    res = run_lab(2000 if args.quick else args.trials, args.group_size, args.seed)
    print_tables(res)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "estimators.json"), "w") as f:
            json.dump(res, f, indent=1)
        plot(res, os.path.join(args.out, "estimators.png"))
    return res


if __name__ == "__main__":
    main()
