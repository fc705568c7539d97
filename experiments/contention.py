"""
A training run beside other work: what torch's thread count and OpenMP's wait policy cost.

Each setting runs the same steps (SFT: the default model and batch; or GRPO from a trained start,
whose iteration samples its answers too; --iters iterations after --warmup uncounted ones) as its
own `python train.py` process, once alone and once beside a busy process on
one core (a Python loop, what any other command is to the run), alternating, --repeats times each.
It prints seconds per step, alone and beside, and their ratio; a run that costs only its share
would take about 2x a two-thread step beside the loop (one core left), or stay at a one-thread step.

    python experiments/contention.py                       # the default settings, about 3 minutes
    python experiments/contention.py --iters=40 --repeats=3
    python experiments/contention.py --algo=grpo --init_from=out/sft   # sampling and training

Settings (environment variables of the train.py process; OpenMP reads them when torch loads it):
    threads=2 passive   the project's default (train.py sets OMP_WAIT_POLICY=PASSIVE unless it is set):
                        a waiting thread sleeps at once
    threads=2 active    OMP_WAIT_POLICY=ACTIVE: waiting threads spin, as torch's default does
    threads=1           one thread: nothing to wait for
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SETTINGS = {
    "threads=2 passive": dict(OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE"),
    "threads=2 active": dict(OMP_NUM_THREADS="2", OMP_WAIT_POLICY="ACTIVE"),
    "threads=1": dict(OMP_NUM_THREADS="1"),
}


def seconds_per_step(env, iters, warmup, algo="sft", init_from=None):
    """The mean wall time of a step after the warm-up, from the run's own metrics.jsonl."""
    with tempfile.TemporaryDirectory() as out:
        clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
        start = ["--train_problems=2000"] if algo == "sft" else [f"--init_from={init_from}"]
        subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), f"--algo={algo}", f"--max_iters={iters + warmup}",
                        "--eval_interval=0", "--checkpoint=False", "--plot=False", "--log_interval=1",
                        *start, f"--out_dir={out}"],
                       env={**clean, **env}, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        times = [r["iter_time"] for r in rows if "iter_time" in r][warmup:]
        return sum(times) / len(times)


def busy_loop():
    """A process that keeps one core busy until it is killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=30, help="counted steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="uncounted first steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="alone/beside pairs per setting")
    parser.add_argument("--algo", default="sft", choices=("sft", "grpo"), help="the steps timed")
    parser.add_argument("--init_from", default="out/sft", help="GRPO's trained start (the ladder's SFT)")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names from SETTINGS")
    args = parser.parse_args(argv)
    results = {}
    for name in args.settings.split(","):
        alone, beside = [], []
        for _ in range(args.repeats):
            alone.append(seconds_per_step(SETTINGS[name], args.iters, args.warmup, args.algo, args.init_from))
            loop = busy_loop()
            try:
                time.sleep(0.5)
                beside.append(seconds_per_step(SETTINGS[name], args.iters, args.warmup, args.algo, args.init_from))
            finally:
                loop.kill()
                loop.wait()
        results[name] = (statistics.median(alone), statistics.median(beside))
        print(f"{name:20s} alone {results[name][0]:.3f} s/step, beside a busy core {results[name][1]:.3f} s/step, "
              f"x{results[name][1] / results[name][0]:.2f}", flush=True)
    base = results.get("threads=2 passive", next(iter(results.values())))[0]
    print("\n| setting | s/step alone | s/step beside a busy process | beside / alone | alone vs threads=2 passive |")
    print("|---|---|---|---|---|")
    for name, (a, b) in results.items():
        print(f"| {name} | {a:.3f} | {b:.3f} | {b / a:.2f} | {a / base:.2f} |")


if __name__ == "__main__":
    main()
