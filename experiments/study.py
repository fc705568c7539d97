"""
The helpers the study scripts in experiments/ share: running train.py with a study's keys (run,
train_once, init_checkpoint, final_models, the flags study_flags and set_keys read; a study script run once as
one arm of a study of studies, script_once), reading a run's
log (rows, last_logged, last_verdicts, paired_ends, finished), bands drawn (band_line), tables and results written (save_study,
save_analysis) and figures saved (pyplot, save_figure). A script puts the repository root on
sys.path first and imports them from experiments.study.
"""

import json
import os
import subprocess
import sys

from nanopost import bands
from nanopost import options
import train as T


def run(overrides, algo=None):
    """train.train with the keys the run's algorithm knows (algo: what runs in place of that algorithm's
    module, as train.train takes it)."""
    known = options.make_config({"algo": overrides["algo"]})
    return T.train({k: v for k, v in overrides.items() if k in known}, algo=algo)


def train_once(out_dir, overrides):
    """out_dir, holding the checkpoint of run(overrides) trained there unless one is there already (a
    study's toy start or helper model: made once per --out, kept when the study runs again)."""
    if not os.path.isfile(os.path.join(out_dir, "ckpt.pt")):
        run(dict(overrides, checkpoint=True, out_dir=out_dir))
    return out_dir


def script_once(args, script, out, flags):
    """The results.json that experiments/SCRIPT writes into `out`, the script run there first (with `flags`,
    and the study's own --quick and --set) unless it has finished."""
    saved = os.path.join(out, "results.json")
    if not os.path.isfile(saved):
        command = [sys.executable, os.path.join(os.path.dirname(os.path.abspath(__file__)), script), f"--out={out}",
                   *flags, *(["--quick"] if args.quick else []), *[f"--set={kv}" for kv in args.set]]
        print(" ".join(["python", *command[1:]]), flush=True)
        subprocess.run(command, check=True)
    return json.load(open(saved))


def init_checkpoint(args, common):
    """--init_from when it holds a checkpoint, else an SFT run of --init_iters on the study's task (`common`)."""
    if args.init_from and os.path.isfile(os.path.join(args.init_from, "ckpt.pt")):
        return args.init_from
    return train_once(os.path.join(args.out, "init"), dict(common, algo="sft", max_iters=args.init_iters,
                                                           eval_interval=args.init_iters))


def study_flags(parser, out, name):
    """The flags every study ends with: --quick, --out (default `out`), --plot (default OUT/NAME.png), --set."""
    parser.add_argument("--quick", action="store_true", help="toy sizes, for a smoke test (numbers mean nothing)")
    parser.add_argument("--out", default=out)
    parser.add_argument("--plot", default="", help=f"the plot's path (default: OUT/{name}.png)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a train.py key for every run")


def set_keys(args):
    """The train.py keys given by --set key=value."""
    return options.parse_args([f"--{kv}" for kv in args.set])


def rows(out_dir):
    return [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]


def last_logged(out_dir, key):
    """The last value of `key` in out_dir/metrics.jsonl (None where it logged none, or has no metrics.jsonl)."""
    if not os.path.isfile(os.path.join(out_dir, "metrics.jsonl")):
        return None
    logged = [row[key] for row in rows(out_dir) if key in row]
    return logged[-1] if logged else None


def last_verdicts(out_dir):
    """The last held-out evaluation's verdicts of a run, one per problem in the problems' order
    (answers.jsonl): what bands.paired compares between two runs on the same problems."""
    evaluations = [json.loads(line) for line in open(os.path.join(out_dir, "answers.jsonl"))]
    return [a["verdict"] for a in [e for e in evaluations if e["split"] == "heldout"][-1]["answers"]]


def paired_ends(runs_a, runs_b):
    """a − b at the runs' last held-out evaluations, seed by seed (runs_a[k] and runs_b[k] one seed's two
    runs, on the same problems), across the seeds by bands.paired_across_seeds: (mean, band, per seed)."""
    pairs = [bands.paired(last_verdicts(a), last_verdicts(b)) for a, b in zip(runs_a, runs_b)]
    mean, half = bands.paired_across_seeds([m for m, _ in pairs], [h for _, h in pairs])
    return mean, half, [m for m, _ in pairs]


def finished(out_dir, overrides, key):
    """Whether out_dir holds a run with these settings (its config.json agrees on every key it has) that
    logged `key` at its last iteration (overrides' max_iters), so that it is read rather than run again."""
    try:
        config, logged = json.load(open(os.path.join(out_dir, "config.json"))), rows(out_dir)
    except (OSError, ValueError):
        return False
    same = all(config[k] == v for k, v in overrides.items() if k in config and k not in ("out_dir", "overwrite"))
    return same and any(r.get("iter") == overrides["max_iters"] and key in r for r in logged)


def pyplot():
    """matplotlib.pyplot, drawing into files only (the Agg backend: no display needed)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def save_figure(fig, path, dpi=100):
    """A study's figure laid out, written to `path` and closed."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def save_study(out, name, results, table, plot, plot_path=""):
    """A study's results.json, its table as NAME.md and its plot (NAME.png unless `plot_path`) into
    `out`, and the table printed: the same last step of every experiment script here."""
    path = os.path.join(out, "results.json")
    with open(path + ".tmp", "w") as f:  # written whole, then renamed: a kill mid-write loses no finished run
        json.dump(results, f, indent=1)
    os.replace(path + ".tmp", path)
    text = table(results)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(text)
    plot(results, plot_path or os.path.join(out, f"{name}.png"))
    print("\n" + text)


def final_models(out, results, start, common, algo):
    """(who, run) for the start and then every arm's and seed's last checkpoint of a study in `out`
    (results["arms"]: {arm: {seed: ...}}, checkpoints in out/ARM_SEED), each loaded with nothing trained."""
    checkpoints = [("start", start)] + [(arm, os.path.join(out, f"{arm}_{seed}"))
                                        for arm, runs in results["arms"].items() for seed in runs]
    for who, checkpoint in checkpoints:
        yield who, run(dict(common, algo=algo, init_from=checkpoint, max_iters=0, eval_interval=0, overwrite=True,
                            out_dir=os.path.join(out, "loaded")))


def band_line(ax, curves, colour, label, n=None, top=None, **style):
    """One line for several seeds' curves, each [(x, y)], aligned by index (the shortest sets the
    length): the mean of x and of y, the band of y shaded (bands.envelope: mean ± band, two seeds'
    range), drawn within [0, top] since every figure drawn so is a count or a share."""
    points = range(min(map(len, curves)))
    xs = [sum(c[j][0] for c in curves) / len(curves) for j in points]
    cells = [bands.envelope([c[j][1] for c in curves], n) for j in points]
    ax.plot(xs, [m for m, _, _ in cells], color=colour, label=label, **style)
    if len(curves) > 1:
        ax.fill_between(xs, [max(0.0, lo) for _, lo, _ in cells], [min(top or float("inf"), hi) for _, _, hi in cells],
                        color=colour, alpha=0.15, lw=0)


def save_analysis(out, name, lines, data):
    """An analysis after a study: its table (lines) as NAME.md and its figures as NAME.json in `out`,
    and the table printed."""
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(data, f, indent=1)
    print("\n".join(lines))


if __name__ == "__main__":  # two arms' ends compared, paired: python -m experiments.study A_1337,A_1338,A_1339 B_1337,B_1338,B_1339
    mean, half, per_seed = paired_ends(sys.argv[1].split(","), sys.argv[2].split(","))
    print(f"a − b, held-out accuracy at the last evaluations, paired: {bands.signed(mean, half)}"
          + f" (per seed {', '.join(f'{d:+.3f}' for d in per_seed)})")
