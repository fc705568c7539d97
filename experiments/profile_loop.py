"""
Where one iteration's time goes, for SFT, DPO, GRPO and PPO, in this checkout or any other commit's
(--repo): the loop's phases timed by wrapping the functions that do them, in one process per algorithm.

    python experiments/profile_loop.py                                  # this checkout
    python experiments/profile_loop.py --repo=../old --tag=old          # another commit, same machine
    python experiments/profile_loop.py --report=out/profile.json        # the table from saved runs

The phases (seconds per iteration: the loop, from its first batches() or evaluate() call to its end,
divided by the run's iterations):
  sampling      the sampler's calls inside the algorithm's batches() (rollouts)
  batches rest  the rest of batches(): scoring the rollouts (old log-probs, reference, reward model),
                advantages, collation
  forward       the algorithm's loss(): the training forward and the loss
  backward      Tensor.backward
  optimizer     AdamW's step
  evaluation    the algorithm's evaluate() (sampling held-out answers), per iteration of the run
  checkpoint    save_checkpoint;  plot: metrics.png
  bookkeeping   everything else in the loop: gradient rescale and clipping, the step's figures,
                logging, monitors, the progress bar, wrappers
Wrapping costs a few microseconds a call. Each algorithm runs as its default command (evaluation and
checkpoints at their defaults) from the same start: SFT from scratch, the others from --sft (the
ladder's SFT checkpoint), copied with its model_args cut to the fields the profiled checkout's
GPTConfig has (an older commit's had fewer; the weights are the same).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from experiments.study import pyplot, save_figure  # noqa: E402  (after the path: the script runs from anywhere)

PHASES = ["sampling", "batches rest", "forward", "backward", "optimizer", "evaluation", "checkpoint", "plot",
          "bookkeeping"]

# runs inside the child process, in the profiled checkout: wrap, then run train.py as __main__
CHILD = r"""
import json, os, runpy, sys, time
sys.path.insert(0, os.getcwd())
import torch, train
algo = __import__(sys.argv[1])
out = sys.argv[2]
sys.argv = ["train.py"] + json.loads(sys.argv[3])
spent, calls, stack = {}, {}, []
first_loop_call = []

def timed(fn, name):
    def wrapper(*args, **kwargs):
        if name in ("batches", "evaluate") and not first_loop_call:
            first_loop_call.append(time.perf_counter())
        label = name
        if name == "sample":  # sampling inside batches() or inside evaluate()
            label = "eval sampling" if "evaluate" in stack else "sampling" if "batches" in stack else "other sampling"
        stack.append(name)
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] = spent.get(label, 0.0) + time.perf_counter() - t0
            calls[label] = calls.get(label, 0) + 1
            stack.pop()
    wrapper.__wrapped_by_profile__ = True
    return wrapper

def wrap_everywhere(original, name):
    wrapped = timed(original, name)
    for module in list(sys.modules.values()):
        for attr, value in list(getattr(module, "__dict__", {}).items()):
            if value is original:
                setattr(module, attr, wrapped)

for fn in ("batches", "loss", "evaluate"):
    setattr(algo, fn, timed(getattr(algo, fn), fn))
for module_name in ("sampler", "model"):
    try:
        module = __import__(module_name)
    except ImportError:
        continue
    if hasattr(module, "sample") and not getattr(module.sample, "__wrapped_by_profile__", False):
        wrap_everywhere(module.sample, "sample")
for module in list(sys.modules.values()):
    for name in ("save_checkpoint", "plot_metrics"):
        value = getattr(module, name, None)
        if callable(value) and not getattr(value, "__wrapped_by_profile__", False):
            wrap_everywhere(value, name)
torch.Tensor.backward = timed(torch.Tensor.backward, "backward")
torch.optim.AdamW.step = timed(torch.optim.AdamW.step, "optimizer")
t0 = time.perf_counter()
runpy.run_path("train.py", run_name="__main__")
end = time.perf_counter()
json.dump({"spent": spent, "calls": calls, "total": end - t0, "loop": end - first_loop_call[0],
           "threads": torch.get_num_threads()}, open(out, "w"))
"""


def phases(raw, iters):
    """Seconds per iteration by phase, from the child's totals."""
    s = raw["spent"]
    sampling = s.get("sampling", 0.0)
    evaluation = s.get("evaluate", 0.0)
    named = {"sampling": sampling, "batches rest": s.get("batches", 0.0) - sampling,
             "forward": s.get("loss", 0.0), "backward": s.get("backward", 0.0),
             "optimizer": s.get("optimizer", 0.0), "evaluation": evaluation,
             "checkpoint": s.get("save_checkpoint", 0.0), "plot": s.get("plot_metrics", 0.0)}
    named["bookkeeping"] = raw["loop"] - sum(named.values())
    return {k: v / iters for k, v in named.items()}


def run_one(repo, algo, args, path):
    child = os.path.join(os.path.dirname(path), "profile_child.py")
    with open(child, "w") as f:
        f.write(CHILD)
    cmd = [sys.executable, child, algo, path, json.dumps(args)]
    out_dir = next(arg.split("=", 1)[1] for arg in args if arg.startswith("--out_dir="))
    shutil.rmtree(out_dir, ignore_errors=True)
    t0 = time.time()
    proc = subprocess.run(cmd, cwd=repo, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{algo} in {repo} failed:\n{proc.stderr[-3000:]}")
    raw = json.load(open(path))
    raw["wall"] = time.time() - t0
    raw["iters"] = raw["calls"]["batches"]  # the loop calls batches() once per iteration
    raw["per_iter"] = phases(raw, raw["iters"])
    return raw


def converted(repo, ckpt_dir, out):
    """ckpt_dir's checkpoint, its model_args cut to the fields of repo's GPTConfig, saved in `out`."""
    import torch
    from nanopost.checkpoints import safe_load
    code = ("import dataclasses, json, sys; sys.path.insert(0, '.'); from model import GPTConfig; "
            "print(json.dumps([f.name for f in dataclasses.fields(GPTConfig)]))")
    fields = json.loads(subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True,
                                       check=True).stdout.splitlines()[-1])
    ckpt = safe_load(os.path.join(ckpt_dir, "ckpt.pt"))
    ckpt["model_args"] = {k: v for k, v in ckpt["model_args"].items() if k in fields}
    os.makedirs(out, exist_ok=True)
    torch.save(ckpt, os.path.join(out, "ckpt.pt"))
    return out


def commands(a):
    """Each algorithm's default command (its own iterations), from the same starting checkpoints."""
    # (no --overwrite, which older commits lack: run_one removes each run directory first)
    return {
        "sft": ["--algo=sft", f"--max_iters={a.sft_iters}", f"--out_dir={a.out}/sft"],
        "dpo": ["--algo=dpo", f"--init_from={a.sft}", f"--out_dir={a.out}/dpo"],
        "grpo": ["--algo=grpo", f"--init_from={a.sft}", f"--out_dir={a.out}/grpo"],
        "ppo": ["--algo=ppo", f"--init_from={a.sft}", f"--out_dir={a.out}/ppo"],
    }


def ordered(results):
    """The results' keys ("algo@tag") by algorithm, then tag."""
    return sorted(results, key=lambda k: k.split("@"))


def table(results):
    """A markdown table: one row per (algo, tag), seconds per iteration by phase."""
    lines = ["| algorithm | commit | s / iteration | " + " | ".join(PHASES) + " |",
             "|---|---|---:|" + "---:|" * len(PHASES)]
    for key in ordered(results):
        algo, tag = key.split("@")
        r = results[key]
        per = r["per_iter"]
        lines.append(f"| {algo} | {tag} | {r['loop'] / r['iters']:.3f} | "
                     + " | ".join(f"{per[p] * 1000:.0f} ms" for p in PHASES) + " |")
    return "\n".join(lines)


def plot(results, path):
    """One stacked bar per (algorithm, commit): seconds per iteration by phase."""
    keys = ordered(results)
    fig, ax = pyplot().subplots(figsize=(9, 0.45 * len(keys) + 1.5))
    for row, key in enumerate(keys):
        left = 0.0
        for i, phase in enumerate(PHASES):
            width = results[key]["per_iter"][phase]
            ax.barh(row, width, left=left, color=f"C{i}", label=phase if row == 0 else None)
            left += width
    ax.set_yticks(range(len(keys)), [k.replace("@", " @ ") for k in keys])
    ax.invert_yaxis()
    ax.set_xlabel("seconds per iteration (the run's iterations, its evaluations included)")
    ax.legend(loc="lower right", fontsize=8)
    save_figure(fig, path, dpi=90)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repo", default=".", help="the checkout to profile (its train.py runs)")
    p.add_argument("--tag", default="this", help="its name in the table")
    p.add_argument("--algos", default="sft,dpo,grpo,ppo")
    p.add_argument("--sft", default="out/sft", help="the SFT checkpoint DPO, GRPO and PPO start from")
    p.add_argument("--sft_iters", type=int, default=60, help="SFT iterations from scratch")
    p.add_argument("--out", default="out/profile", help="run directories and results.json")
    p.add_argument("--report", default=None, help="print the table from this results.json and stop")
    p.add_argument("--plot", default=None, help="also draw the bars of every result into this png")
    a = p.parse_args()
    if a.report:
        results = json.load(open(a.report))
        print(table(results))
        if a.plot:
            plot(results, a.plot)
        return
    a.out = os.path.abspath(a.out)
    os.makedirs(a.out, exist_ok=True)
    if set(a.algos.split(",")) - {"sft"}:  # (SFT starts from scratch)
        a.sft = converted(os.path.abspath(a.repo), os.path.abspath(a.sft), os.path.join(a.out, f"start_{a.tag}"))
    results_path = os.path.join(a.out, "results.json")
    results = json.load(open(results_path)) if os.path.exists(results_path) else {}
    for algo in a.algos.split(","):
        raw = run_one(os.path.abspath(a.repo), algo, commands(a)[algo], os.path.join(a.out, f"{algo}_{a.tag}.json"))
        results[f"{algo}@{a.tag}"] = raw
        print(f"{algo}@{a.tag}: loop {raw['loop']:.1f} s for {raw['iters']} iterations, wall {raw['wall']:.1f} s: "
              + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in raw["per_iter"].items()), flush=True)
        with open(results_path, "w") as f:
            json.dump(results, f, indent=1)
    print(table(results))
    if a.plot:
        plot(results, a.plot)


if __name__ == "__main__":
    main()
