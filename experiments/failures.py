"""
What breaks an RL run, and how you would see it (docs/failures.md): each classic failure caused on
purpose in a short GRPO run from the SFT checkpoint by replacing the one function of grpo.py it breaks
(FAILURES: the broken function beside the failure's name, as code), beside a control run of the same length in which
no monitor fires. Per failure: the first iteration its monitor fired, the figure that gave it away
against the control, and held-out greedy accuracy at the start and at the end.

    python experiments/failures.py                            # the gallery (out/sft; out/calc_sft for retokenize)
    python experiments/failures.py --study=entropy --seeds=3  # entropy: the learning rate that collapses it
    python experiments/failures.py --quick --out=/tmp/failures  # a toy-size smoke test, from a random model

The gallery writes OUT/failures.md (the table), results.json and --plot (default docs/img/failures.png:
per failure its figure against the control, the monitor's alarm region shaded, the first firing
marked). The entropy study runs the control, the collapsing learning rate and the field's controls
on it (Clip-Cov, the top-entropy mask) with --seeds seeds each, and writes OUT/entropy/entropy.md,
results.json and --plot (default docs/img/entropy.png: the entropy per iteration, mean and range over
the seeds).
"""

import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import dataclasses  # noqa: E402
import re  # noqa: E402
from contextlib import contextmanager  # noqa: E402

import torch  # noqa: E402

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
import grpo  # noqa: E402
import lab.kl_reward  # noqa: E402
from nanopost import monitors  # noqa: E402
from nanopost.checkpoints import frozen  # noqa: E402
from experiments.study import pyplot, rows, run, save_figure, save_study  # noqa: E402  (train.train with the run's keys, ...)
from nanopost.rollouts import layout, rollouts  # noqa: E402

# ----------------------------------------------------------------------------------------------
# Each failure is the one function of grpo.py it breaks, replaced by the broken one (breaks: a list of
# (module, the function's name, its broken replacement)); the run is plain GRPO otherwise.

SAMPLER_ONLY_TEMPERATURE = 0.7  # sampler_temperature's


def fp8_sampler(run, model, problems, seed):
    """The rollouts from an FP8 (e4m3) copy of the weights, one scale per tensor (its largest entry maps to
    e4m3's largest, 448): the sampler's log-probs are π_old, the trainer's π_θ are fp32's."""
    copy = frozen(model)
    with torch.no_grad():
        for p in copy.parameters():
            scale = p.abs().max().clamp(min=1e-12) / 448
            p.copy_((p / scale).to(torch.float8_e4m3fn).float() * scale)
    return SAMPLE(run, copy, problems, seed)


def sampler_temperature(run, model, problems, seed):
    """The sampler's copy has its head divided by T = 0.7: it draws from softmax(z/T) and reports those
    log-probs, while the trainer scores softmax(z) (a temperature set on the inference engine alone)."""
    copy = frozen(model)
    copy.lm_head.weight = torch.nn.Parameter(copy.lm_head.weight / SAMPLER_ONLY_TEMPERATURE, requires_grad=False)
    return SAMPLE(run, copy, problems, seed)  # (a new head parameter: a tied embedding keeps its own weights)


def top_p_uncorrected(run, model, problems, seed):
    """Nucleus sampling (top_p = 0.9), its log-probs on the renormalised cut, the trainer scoring the whole softmax."""
    return rollouts(run, model, problems, run.cfg["group_size"], temperature=run.cfg["temperature"],
                    max_new_tokens=run.cfg["max_new_tokens"], seed=seed, top_p=0.9)


def retokenize(run, model, problems, seed):
    """Each transcript decoded to text and encoded again before training, as a pipeline does that keeps
    messages rather than token ids. A tool's tags come back as the bytes of their text, so the tool's
    result is trained on as if the policy wrote it (mask 1), and the sampler's log-probs, laid over the new
    tokens in order, belong to other tokens. The rows keep the sampled ids in `responses`."""
    ro = SAMPLE(run, model, problems, seed)
    prompts = [ids[:n] for ids, n in zip(ro.ids.tolist(), ro.prompt_lens.tolist())]
    room = [run.raw_model.config.block_size + 1 - len(p) for p in prompts]  # (cut to the context, as a pipeline does)
    tokens = [(run.tok.encode(text) + ([] if cut else [run.tok.eos]))[:n]
              for text, cut, n in zip(ro.texts, ro.truncated.tolist(), room)]
    sampled = [lp[n - 1:n - 1 + len(t)] for lp, n, t in zip(ro.old_logprobs.tolist(), ro.prompt_lens.tolist(), ro.responses)]
    logprobs = [(lp + [0.0] * len(t))[:len(t)] for lp, t in zip(sampled, tokens)]
    rows = layout(run, prompts, tokens, logprobs, [[0] * len(t) for t in tokens])
    return dataclasses.replace(ro, **{**rows, "responses": ro.responses})


def prompt_format(run, model, problems, seed):
    """The RL prompts' template differs from SFT's: it opens the assistant's turn with "Answer:" already
    written, so the policy, which writes the marker itself, answers without the form the verifier asks for."""
    marker = run.tok.encode("Answer:")
    return rollouts(run, model, problems, run.cfg["group_size"], temperature=run.cfg["temperature"],
                    max_new_tokens=run.cfg["max_new_tokens"], seed=seed,
                    prompt_ids=lambda problem: run.tok.prompt_ids(problem["prompt"]) + marker)


def nan_logprob(run, state, model, ro):
    """−inf on 1% of the response tokens' π_old (a fixed pattern; an engine's log 0 for a token it should not
    have drawn), unguarded: ρ = exp(log π_θ + inf) is inf and the loss NaN."""
    SCORE(run, state, model, ro)
    hit = torch.rand(ro.mask.shape, generator=torch.Generator().manual_seed(0)).to(ro.mask.device) < 0.01
    ro.old_logprobs = ro.old_logprobs.masked_fill(hit & (ro.mask > 0), float("-inf"))


def shifted_advantages(rewards, G):
    """An off-by-one in the row -> group index: each group gets the previous group's advantages."""
    return GROUP_ADVANTAGES(rewards, G).roll(G, 0)


def rewarded(reward):
    """grpo.sample_groups with its reward line replaced by reward(run, ro)."""
    def sample_groups(run, state, model, it, shard):
        ro = grpo.sample(run, model, *grpo.shard_problems(run, it, shard, 0))
        grpo.score(run, state, model, ro)
        ro.reward = reward(run, ro)  # the broken line (grpo: ro.verified)
        ro.advantages = grpo.group_advantages(ro.reward, run.cfg["group_size"])
        return ro
    return sample_groups


def lax_verify(problem, response):
    """The right number anywhere in the response passes, so listing several guesses earns the reward."""
    return 1.0 if str(problem["answer"]) in re.findall(r"-?[0-9]+", response) else 0.0


SAMPLE, SCORE, GROUP_ADVANTAGES, VERIFIER_CHECK = grpo.sample, grpo.score, grpo.group_advantages, grpo.verifier_check
# name: (the functions replaced, train.py keys, the task's SFT start: main or calculator, the figure that gives
# it away, the monitor that must name it). The collapsing learning rate replaces nothing: the learning rate is the switch.
FAILURES = dict(
    fp8_sampler=([(grpo, "sample", fp8_sampler)], {}, "main", "ratio_dev", "ratio_drift"),
    sampler_temperature=([(grpo, "sample", sampler_temperature)], {}, "main", "ratio_dev", "ratio_drift"),
    top_p_uncorrected=([(grpo, "sample", top_p_uncorrected)], {}, "main", "ratio_dev", "ratio_drift"),
    retokenize=([(grpo, "sample", retokenize)], {}, "calculator", "retokenized_frac", "retokenized"),
    prompt_format=([(grpo, "sample", prompt_format)], {}, "main", "parse_error_rate", "parse_errors"),
    # the KL in the reward (--algo kl_reward) and the k3 term kept in the loss
    kl_twice=([(lab.kl_reward, "loss", grpo.loss)], dict(algo="kl_reward"), "main", "kl_reward", "kl_twice"),
    **{"learning rate 1.0": ([], dict(learning_rate=1.0, min_lr=1.0), "main", "entropy", "entropy_collapse")},
    nan_logprob=([(grpo, "score", nan_logprob)], {}, "main", "nonfinite_logprob_frac", "nonfinite"),
    shifted_advantages=([(grpo, "group_advantages", shifted_advantages)], {}, "main", "adv_sign_error_frac",
                        "misaligned_advantages"),
    all_equal=([(grpo, "sample_groups", rewarded(lambda run, ro: torch.zeros_like(ro.verified)))], {}, "main",
               "degenerate_frac", "degenerate_groups"),  # a task out of reach
    length_bonus=([(grpo, "sample_groups", rewarded(lambda run, ro: ro.verified + 0.01 * ro.lengths.to(ro.verified)))],
                  {}, "main", "reward_len_corr", "length_bias"),  # +0.01 reward per response token
    format_exploit=([(grpo, "sample_groups", rewarded(lambda run, ro: torch.tensor(
        [lax_verify(p, t) for p, t in zip(ro.problems, ro.texts)], device=ro.verified.device))),
        (grpo, "verifier_check", lambda env, verify: VERIFIER_CHECK(env, lax_verify))], {}, "main",
        "verifier_error_rate", "verifier_errors"),  # the reward's verifier is lax; held-out accuracy is the strict one's
    stale_rollouts=([], dict(algo="one_step_off"), "main", "staleness", "stale_rollouts"),
)


@contextmanager
def broken(breaks):
    """The run with each (module, name, replacement) in place, the originals back after."""
    originals = [(module, name, getattr(module, name)) for module, name, _ in breaks]
    try:
        for module, name, replacement in breaks:
            setattr(module, name, replacement)
        yield
    finally:
        for module, name, original in originals:
            setattr(module, name, original)


# each figure's alarm region (monitors.ALARMS): (a threshold, "above" or "below"; relative: × the first value)
REGIONS = dict(ratio_dev=(1e-3, "above"), retokenized_frac=(0.0, "above"), parse_error_rate=(0.2, "above"),
               entropy=(0.25, "below relative"), nonfinite_logprob_frac=(0.0, "above"),
               adv_sign_error_frac=(0.01, "above"), degenerate_frac=(0.75, "above"), reward_len_corr=(0.5, "above"),
               verifier_error_rate=(0.0, "above"))
# the entropy study: the control, Clip-Cov on it, the collapsing learning rate and the field's two controls on it
ARMS = [("control (lr 1e-4)", {}), ("Clip-Cov 0.2 (lr 1e-4)", dict(algo="clip_cov", clip_cov=0.2)),
        ("lr 1.0", dict(learning_rate=1.0, min_lr=1.0)),
        ("lr 1.0 + Clip-Cov 0.2", dict(algo="clip_cov", learning_rate=1.0, min_lr=1.0, clip_cov=0.2)),
        ("lr 1.0 + top-entropy 0.2", dict(algo="entropy_mask", learning_rate=1.0, min_lr=1.0, top_entropy_quantile=0.2))]
QUICK = dict(n_layer=1, n_head=2, n_embd=32, block_size=128, batch_size=8, eval_batch_size=16, device="cpu",
             init_from="scratch")


def base(args, task):
    """The train.py keys every run of a task shares: GRPO from the task's SFT start, short, held-out
    accuracy at the start and the end (the calculator's also sampled: its SFT answers bare when greedy)."""
    calculator = dict(env="calculator", eval_samples=4) if task == "calculator" else dict(eval_samples=0)
    keys = dict(algo="grpo", init_from=args.init_from if task == "main" else args.calc_init_from,
                prompts_per_iter=args.prompts, group_size=args.group_size, max_iters=args.iters,
                eval_interval=args.iters, eval_problems=args.eval_problems, plot=False, checkpoint=False,
                seed=args.seed, **calculator)
    keys.update(QUICK if args.quick else {})
    return keys


def outcome(out_dir, figure, accuracy="heldout_acc"):
    """One run's record: the monitors that fired, the figure per iteration, held-out accuracy at its
    evaluations."""
    logged = rows(out_dir)
    cfg = json.load(open(os.path.join(out_dir, "config.json")))
    trained = [r for r in logged if "loss" in r]
    return dict(fired=monitors.alarms(logged, cfg), figure=figure, iters=[r["iter"] for r in trained],
                values=[r.get(figure, 0.0) for r in trained],  # (a rare figure is logged only when nonzero)
                heldout=[r[accuracy] for r in logged if accuracy in r], accuracy=accuracy)


def gallery(args):
    """Every failure's run and each task's control: {name: record}."""
    results, t0 = {}, time.time()
    tasks = {"main": args.init_from, "calculator": args.calc_init_from}
    for task, start in tasks.items():
        if not args.quick and not os.path.isfile(os.path.join(start, "ckpt.pt")):
            print(f"skipping the {task} task's runs: no SFT checkpoint at {start} (python ladder.py makes it)")
            continue
        control = os.path.join(args.out, f"control_{task}")
        run(dict(base(args, task), out_dir=control))
        for name, (breaks, switch, on, figure, _) in FAILURES.items():
            if on != task:
                continue
            out_dir = os.path.join(args.out, name.replace(" ", "_").replace(",", ""))
            try:
                with broken(breaks):
                    run(dict(base(args, task), **switch, out_dir=out_dir))
                stopped = None
            except ValueError as e:  # the loop's guard stopped it (a non-finite loss): its last row names the cause
                stopped = str(e).split(":")[0]
            accuracy = "heldout_sampled_acc" if task == "calculator" else "heldout_acc"
            results[name] = dict(outcome(out_dir, figure, accuracy), switch=switch, task=task, stopped=stopped,
                                 control=outcome(control, figure, accuracy))
    results["wall_s"] = time.time() - t0
    return results


def threshold_text(name, switch):
    """The monitor a failure must fire and its threshold."""
    monitor = FAILURES[name][4]
    return monitor, monitors.ALARMS[monitor][1].split(":")[0]


def summary(values, figure):
    """A run's figure in one number: its lowest value for the entropy, else its largest."""
    return min(values) if figure == "entropy" else max(values)


def gallery_table(results):
    lines = ["| failure | switch | monitor: threshold | first fired | the figure, broken vs control "
             "| held-out accuracy: start → end (control) |", "|---" * 6 + "|"]
    for name, r in results.items():
        if name == "wall_s":
            continue
        monitor, threshold = threshold_text(name, r["switch"])
        others = [f"{m} ({it})" for m, it in r["fired"].items() if m != monitor]
        when = f"iter {r['fired'][monitor]}" if monitor in r["fired"] else "not fired"
        when += (f"; also {', '.join(others)}" if others else "") + f"; control: {monitors.fired_text(r['control']['fired'])}"
        switch = " ".join([f"{m.__name__}.{n} broken" for m, n, _ in FAILURES[name][0]]
                          + [f"--{k}={v}" for k, v in r["switch"].items()])
        figure = (f"{r['figure']} {summary(r['values'], r['figure']):.3g} vs "
                  f"{summary(r['control']['values'], r['figure']):.3g}")
        acc = lambda h: f"{h[0]:.2f} → {h[-1]:.2f}" if h else f"stopped at {r['stopped']}"
        sampled = " sampled" if r["accuracy"] == "heldout_sampled_acc" else ""
        lines.append(f"| {name} | `{switch}` | `{monitor}`: {threshold} | {when} | {figure} | "
                     f"{acc(r['heldout'])} ({acc(r['control']['heldout'])}){sampled} |")
    return ("\n".join(lines) + "\n\nHeld-out accuracy: greedy, or for the calculator task sampled (4 answers per "
            f"problem at T = 1). Wall time: {results['wall_s'] / 60:.1f} min.\n")


def plot_gallery(results, path):
    """One panel per failure: its figure per iteration, broken (red) against its control (blue), the
    monitor's alarm region shaded, the first firing marked."""
    plt = pyplot()
    names = [n for n in results if n != "wall_s"]
    ncol = 4
    nrow = -(-(len(names) + 1) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 2.9 * nrow), squeeze=False)
    for ax, name in zip(axes.flat, names):
        r = results[name]
        figure = r["figure"]
        ax.plot(r["control"]["iters"], r["control"]["values"], color="#1f77b4", marker=".", label="control")
        ax.plot(r["iters"], r["values"], color="#d62728", marker=".", label="broken")
        if figure in REGIONS:
            threshold, side = REGIONS[figure]
            if side.endswith("relative"):
                threshold *= r["control"]["values"][0]
            lo, hi = ax.get_ylim()
            ax.axhspan(threshold, max(hi, threshold), color="#d62728", alpha=0.08, lw=0) if side == "above" else \
                ax.axhspan(min(lo, 0), threshold, color="#d62728", alpha=0.08, lw=0)
            ax.set_ylim(lo, hi)
        monitor, _ = threshold_text(name, r["switch"])
        if monitor in r["fired"]:
            ax.axvline(r["fired"][monitor], color="#7f7f7f", ls=":", lw=1)
        ax.set_title(f"{name}: {figure}" + (f"\n{monitor} at iter {r['fired'][monitor]}" if monitor in r["fired"]
                                             else "\nnot fired"), fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("iteration", fontsize=7)
    axes.flat[0].legend(fontsize=7)
    ax = axes.flat[len(names)]  # the summary: held-out accuracy at the end of each run against its control
    ends = [results[n]["heldout"][-1] for n in names]
    ax.barh(range(len(names)), ends, color="#d62728", height=0.6)
    for i, n in enumerate(names):
        ax.plot([results[n]["control"]["heldout"][-1]] * 2, [i - 0.4, i + 0.4], color="#1f77b4", lw=2)
    ax.set_yticks(range(len(names)), names, fontsize=6)
    ax.invert_yaxis()
    ax.set_title("held-out accuracy at the end (bar) and\nthe control's (blue mark; calculator: sampled)", fontsize=9)
    ax.tick_params(axis="x", labelsize=7)
    for ax in list(axes.flat)[len(names) + 1:]:
        ax.axis("off")
    fig.suptitle("Each failure's figure against its control (shaded: the monitor's alarm region; dotted: "
                 "its first firing)", fontsize=10)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    save_figure(fig, path, dpi=90)


def entropy_study(args, out):
    """ARMS × --seeds runs into `out`: {arm: [record per seed]} with the entropy per iteration."""
    results, t0 = {}, time.time()
    for arm, keys in ARMS:
        results[arm] = []
        for k in range(args.seeds):
            out_dir = os.path.join(out, f"{arm.split(' (')[0].replace(' ', '_').replace('+', '')}_seed{k}")
            run(dict(base(args, "main"), **keys, seed=args.seed + k, out_dir=out_dir))
            results[arm].append(outcome(out_dir, "entropy"))
    results["wall_s"] = time.time() - t0
    return results


def entropy_table(results, n):
    lines = ["| arm | seeds | entropy, first → lowest (per seed) | entropy_collapse fired (per seed) | final entropy "
             "| held-out greedy at the end |", "|---" * 6 + "|"]
    for arm, runs in results.items():
        if arm == "wall_s":
            continue
        per_seed = "; ".join(f"{r['values'][0]:.3f} → {min(r['values']):.3g}" for r in runs)
        fired = ", ".join(str(r["fired"].get("entropy_collapse", "–")) for r in runs)
        final = bands.cell([r["values"][-1] for r in runs], None)
        acc = bands.cell([r["heldout"][-1] for r in runs], n)
        lines.append(f"| {arm} | {len(runs)} | {per_seed} | {fired} | {final} | {acc} |")
    return "\n".join(lines) + f"\n\nWall time: {results['wall_s'] / 60:.1f} min.\n"


def plot_entropy(results, path):
    """Entropy per iteration of each arm: the mean over seeds, the seeds' range shaded."""
    plt = pyplot()
    colours = ["#1f77b4", "#17becf", "#d62728", "#ff7f0e", "#9467bd"]
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for (arm, runs), colour in zip([(a, r) for a, r in results.items() if a != "wall_s"], colours):
        iters = runs[0]["iters"]
        values = [[r["values"][i] for r in runs] for i in range(len(iters))]
        ax.plot(iters, [sum(v) / len(v) for v in values], color=colour, marker=".", label=arm)
        ax.fill_between(iters, [min(v) for v in values], [max(v) for v in values], color=colour, alpha=0.15, lw=0)
    first = results[ARMS[0][0]][0]["values"][0]
    ax.axhspan(0, first / 4, color="#d62728", alpha=0.06, lw=0, label="entropy_collapse's region")
    ax.set_xlabel("iteration")
    ax.set_ylabel("token entropy (nats)")
    ax.set_title("Entropy of GRPO's sampled tokens, mean and range over seeds", fontsize=10)
    ax.legend(fontsize=7)
    save_figure(fig, path, dpi=90)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--study", default="gallery", choices=("gallery", "entropy"))
    parser.add_argument("--init_from", default="out/sft", help="the main task's SFT checkpoint")
    parser.add_argument("--calc_init_from", default="out/calc_sft", help="the calculator task's SFT checkpoint")
    parser.add_argument("--iters", type=int, default=8, help="GRPO iterations of every run")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per iteration")
    parser.add_argument("--group_size", type=int, default=8)
    parser.add_argument("--eval_problems", type=int, default=100, help="held-out problems, greedy, at the start and end")
    parser.add_argument("--seed", type=int, default=1337)
    parser.add_argument("--seeds", type=int, default=3, help="the entropy study's seeds per arm")
    parser.add_argument("--quick", action="store_true", help="toy sizes from a random model, for a smoke test")
    parser.add_argument("--out", default="out/failures")
    parser.add_argument("--plot", default="", help="the figure (default: docs/img/failures.png or docs/img/entropy.png)")
    args = parser.parse_args()
    if args.quick:
        args.iters, args.prompts, args.group_size, args.eval_problems, args.seeds = 2, 2, 4, 8, 2
    if args.study == "gallery":
        os.makedirs(args.out, exist_ok=True)
        default = os.path.join(args.out, "failures.png") if args.quick else os.path.join(ROOT, "docs", "img", "failures.png")
        save_study(args.out, "failures", gallery(args), gallery_table, plot_gallery, args.plot or default)
    else:
        out = os.path.join(args.out, "entropy")
        os.makedirs(out, exist_ok=True)
        default = os.path.join(out, "entropy.png") if args.quick else os.path.join(ROOT, "docs", "img", "entropy.png")
        save_study(out, "entropy", entropy_study(args, out), lambda r: entropy_table(r, args.eval_problems),
                   plot_entropy, args.plot or default)

if __name__ == "__main__":
    main()
