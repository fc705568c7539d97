"""
RL's Razor on the ladder (Shenfeld et al. 2025, "RL's Razor: Why Online Reinforcement Learning Forgets
Less", arXiv:2509.04259; docs/menu.md): how much a post-trained model forgets tracks its KL to the model it
started from, measured on the new task's own prompts, whatever the algorithm. For every post-SFT stage of a
finished `python ladder.py` (--root) this measures, against the SFT stage they all start from:

  KL        E_{y ~ π_stage}[Σ_t log π_stage(y_t) − log π_sft(y_t)] on --problems held-out prompts of the
            stage's task, --samples answers each at T = 1, mean ± 1.96·SE over the answers
  forgetting (1) the pre-training text's loss: the per-token NLL of --docs held-out documents of the task's
            corpus (the pretrain stage's validation text), minus the SFT model's, ± 1.96·SE over documents
            (paired: the same documents); (2) greedy accuracy on a task no stage trained on (--other: the
            task's keys changed, default two-step chains env_ops=2), minus the SFT model's, paired band

One point per stage in two panels (forgetting against KL), its bands as error bars; a stage the ladder
did not run is skipped, said. The ranking by KL against the ranking by forgetting is printed (Spearman's ρ).

    python experiments/razor.py --root=out                         # after python ladder.py
    python experiments/razor.py --root=out --stages=dpo,grpo,my_dft --other=env_ops=4
"""

import argparse
import json
import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from nanopost import bands  # noqa: E402  (after the path: the script runs from anywhere)
from nanopost.checkpoints import load_model  # noqa: E402
from nanopost.data import collate  # noqa: E402
from nanopost.options import config_env  # noqa: E402
from nanopost.distributed import setup_device  # noqa: E402
from nanopost.options import parse_args  # noqa: E402
from nanopost.rollouts import rollouts  # noqa: E402
from nanopost.tokenizer import make_tokenizer  # noqa: E402
from experiments.study import pyplot, save_figure  # noqa: E402
from model import sequence_logprobs  # noqa: E402
from sft import masked_nll  # noqa: E402

STAGES = ("dpo", "ppo", "grpo", "rft", "opd")  # the ladder's post-SFT policy stages on the main task


def stage_run(stage_dir, overrides=None):
    """A run object with the stage's tokenizer and task (its config, `overrides` on top) on the CPU."""
    cfg = dict(json.load(open(os.path.join(stage_dir, "config.json"))), **(overrides or {}))
    run = setup_device(dict(device="cpu"))
    run.cfg, run.tok = cfg, make_tokenizer(cfg["tokenizer"])
    run.env = config_env(cfg)
    return run


@torch.no_grad()
def kl_per_answer(run, model, start, problems, samples):
    """Σ_t log π(y_t) − log π_start(y_t) of each of problems × samples answers sampled from `model` at T = 1."""
    tasks = run.env.problems("heldout", problems, seed=0)
    roll = rollouts(run, model, tasks, samples, temperature=1.0, seed=1, batch_size=run.cfg["eval_batch_size"])
    return ((roll.old_logprobs - sequence_logprobs(start, roll.ids, 1.0)) * roll.mask).sum(1).tolist()


@torch.no_grad()
def corpus_nll(run, model, docs):
    """The per-token NLL of each of `docs` held-out documents of the task's corpus (seed 1: the pretrain
    stage's validation text), cut to the model's block."""
    L = model.config.block_size + 1
    out = []
    for text in run.env.corpus(docs, seed=1):
        ids = ([run.tok.bos] + run.tok.encode(text) + [run.tok.eos])[:L]
        total, count = masked_nll(model, *collate([(ids, [1] * len(ids))], run.tok.pad, "cpu"))
        out.append(float(total) / float(count))
    return out


def correct_per_problem(run, model, n):
    """1/0 per problem of greedy answers to n held-out problems of run's task (as evaluation.greedy_accuracy)."""
    tasks = run.env.problems("heldout", n, seed=0)
    return rollouts(run, model, tasks, 1, temperature=0.0, seed=0, batch_size=run.cfg["eval_batch_size"]).verified.tolist()


def mean_band(values):
    """(mean, 1.96·SE) of a list."""
    mean = sum(values) / len(values)
    var = sum((v - mean) ** 2 for v in values) / max(len(values) - 1, 1)
    return mean, 1.96 * math.sqrt(var / len(values))


def measure(stage_dir, start_dir, start_figures, args):
    """A stage's KL to the start and its forgetting, each (mean, band)."""
    run = stage_run(stage_dir)
    model, start = load_model(stage_dir, "cpu").eval(), load_model(start_dir, "cpu").eval()
    other = stage_run(stage_dir, args.other_keys)
    nll = corpus_nll(run, model, args.docs)
    correct = correct_per_problem(other, model, args.problems)
    return dict(kl=mean_band(kl_per_answer(run, model, start, args.problems, args.samples)),
                corpus_loss_rise=mean_band([a - b for a, b in zip(nll, start_figures["nll"])]),
                other_acc_drop=bands.paired(start_figures["correct"], correct),
                other_acc=sum(correct) / len(correct))


def plot(results, path):
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, key, label in ((axes[0], "corpus_loss_rise", "pre-training text: NLL rise over SFT (nats/token)"),
                           (axes[1], "other_acc_drop", "untrained task: accuracy drop from SFT")):
        for name, r in results["stages"].items():
            (x, dx), (y, dy) = r["kl"], r[key]
            ax.errorbar([x], [y], xerr=[dx], yerr=[dy] if dy is not None else None, fmt="o", capsize=3, label=name)
            ax.annotate(name, (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.axhline(0, color="grey", lw=0.6)
        ax.set_xlabel("KL(stage ‖ SFT) on the task's held-out prompts (nats per answer)")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_title("RL's Razor: forgetting against KL to the start, every stage a point", fontsize=9)
    save_figure(fig, path, dpi=110)


def spearman(xs, ys):
    """Spearman's rank correlation of two lists (no ties expected)."""
    rank = lambda v: {i: r for r, i in enumerate(sorted(range(len(v)), key=v.__getitem__))}
    rx, ry = rank(xs), rank(ys)
    n = len(xs)
    return 1 - 6 * sum((rx[i] - ry[i]) ** 2 for i in range(n)) / (n * (n * n - 1)) if n > 1 else float("nan")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.strip().split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", default="out", help="the ladder's --out_root (its sft stage is the start)")
    parser.add_argument("--start", default="sft", help="the stage every other one started from")
    parser.add_argument("--stages", default=",".join(STAGES), help="comma-separated stage directories under --root")
    parser.add_argument("--problems", type=int, default=200, help="held-out prompts (KL) and untrained-task problems")
    parser.add_argument("--samples", type=int, default=4, help="answers sampled per prompt for the KL")
    parser.add_argument("--docs", type=int, default=256, help="held-out documents of the pre-training text")
    parser.add_argument("--other", default="env_ops=2", help="the untrained task: comma-separated KEY=VALUE on the stage's own")
    parser.add_argument("--out", default="", help="where razor.json and razor.png go (default: ROOT/razor)")
    args = parser.parse_args(argv)
    args.other_keys = parse_args([f"--{kv}" for kv in args.other.split(",") if kv])
    torch.set_num_threads(1)
    start_dir, out = os.path.join(args.root, args.start), args.out or os.path.join(args.root, "razor")
    os.makedirs(out, exist_ok=True)
    start = load_model(start_dir, "cpu").eval()
    start_figures = dict(nll=corpus_nll(stage_run(start_dir), start, args.docs),
                         correct=correct_per_problem(stage_run(start_dir, args.other_keys), start, args.problems))
    results = dict(settings=dict(vars(args), other_keys=args.other_keys),
                   start=dict(corpus_nll=mean_band(start_figures["nll"]),
                              other_acc=sum(start_figures["correct"]) / args.problems), stages={})
    for name in args.stages.split(","):
        stage_dir = os.path.join(args.root, name)
        if not os.path.isfile(os.path.join(stage_dir, "ckpt.pt")):
            print(f"razor: {stage_dir} has no checkpoint: skipped")
            continue
        results["stages"][name] = measure(stage_dir, start_dir, start_figures, args)
    lines = [f"SFT start: pre-training text NLL {results['start']['corpus_nll'][0]:.4f}, untrained-task accuracy "
             f"{results['start']['other_acc']:.3f} ({args.other}, {args.problems} problems)", "",
             "| stage | KL to SFT (nats/answer) | pre-training text NLL rise | untrained-task accuracy drop (its accuracy) |",
             "|---|---|---|---|"]
    for name, r in results["stages"].items():
        drop, half = r["other_acc_drop"]
        lines.append(f"| {name} | {r['kl'][0]:.3f} ± {r['kl'][1]:.3f} | {r['corpus_loss_rise'][0]:+.4f} ± "
                     f"{r['corpus_loss_rise'][1]:.4f} | {drop:+.3f} ± {half:.3f} ({r['other_acc']:.3f}) |")
    names = list(results["stages"])
    if len(names) > 2:
        kls = [results["stages"][n]["kl"][0] for n in names]
        for key in ("corpus_loss_rise", "other_acc_drop"):
            values = [results["stages"][n][key][0] for n in names]
            lines.append(f"\nSpearman's ρ, KL against {key}: {spearman(kls, values):+.2f} ({len(names)} stages)")
    text = "\n".join(lines) + "\n"
    print(text)
    with open(os.path.join(out, "razor.md"), "w") as f:
        f.write(text)
    with open(os.path.join(out, "razor.json"), "w") as f:
        json.dump(results, f, indent=1)
    if names:
        plot(results, os.path.join(out, "razor.png"))
    return results


if __name__ == "__main__":
    main()
