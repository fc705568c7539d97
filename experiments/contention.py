"""
A training run beside other work: what torch's thread count and OpenMP's wait policy cost.

Each setting runs the same SFT steps (the default model and batch, --iters iterations after --warmup
uncounted ones) as its own `python train.py` process, once alone and once beside a busy process on
one core (a Python loop, what any other command is to the run), alternating, --repeats times each.
It prints seconds per step, alone and beside, and their ratio; a run that costs only its share
would take about 2x a two-thread step beside the loop (one core left), or stay at a one-thread step.

    python experiments/contention.py                       # the default settings, about 4 minutes
    python experiments/contention.py --iters=40 --repeats=3

Settings (environment variables of the train.py process; OpenMP reads them at start):
    threads=2 spin      torch's default on 2 cores: OpenMP threads spin while they wait
    threads=2 passive   OMP_WAIT_POLICY=PASSIVE: a waiting thread sleeps at once
    threads=2 spin=10k  GOMP_SPINCOUNT=10000: spin briefly, then sleep
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
    "threads=2 spin": dict(OMP_NUM_THREADS="2"),
    "threads=2 passive": dict(OMP_NUM_THREADS="2", OMP_WAIT_POLICY="PASSIVE"),
    "threads=2 spin=10k": dict(OMP_NUM_THREADS="2", GOMP_SPINCOUNT="10000"),
    "threads=1": dict(OMP_NUM_THREADS="1"),
}


def seconds_per_step(env, iters, warmup):
    """The mean wall time of a step after the warm-up, from the run's own metrics.jsonl."""
    with tempfile.TemporaryDirectory() as out:
        clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
        subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), "--algo=sft", f"--max_iters={iters + warmup}",
                        "--eval_interval=0", "--checkpoint=False", "--plot=False", "--log_interval=1",
                        "--train_problems=2000", f"--out_dir={out}"],
                       env={**clean, **env}, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT)
        rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
        times = [r["iter_time"] for r in rows if "iter_time" in r][warmup:]
        return sum(times) / len(times)


def busy_loop():
    """A process that keeps one core busy until it is killed."""
    return subprocess.Popen([sys.executable, "-c", "while True: pass"])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iters", type=int, default=30, help="counted SFT steps per run")
    parser.add_argument("--warmup", type=int, default=5, help="uncounted first steps per run")
    parser.add_argument("--repeats", type=int, default=2, help="alone/beside pairs per setting")
    parser.add_argument("--settings", default=",".join(SETTINGS), help="comma-separated names from SETTINGS")
    args = parser.parse_args(argv)
    results = {}
    for name in args.settings.split(","):
        alone, beside = [], []
        for _ in range(args.repeats):
            alone.append(seconds_per_step(SETTINGS[name], args.iters, args.warmup))
            loop = busy_loop()
            try:
                time.sleep(0.5)
                beside.append(seconds_per_step(SETTINGS[name], args.iters, args.warmup))
            finally:
                loop.kill()
                loop.wait()
        results[name] = (statistics.median(alone), statistics.median(beside))
        print(f"{name:20s} alone {results[name][0]:.3f} s/step, beside a busy core {results[name][1]:.3f} s/step, "
              f"x{results[name][1] / results[name][0]:.2f}", flush=True)
    base = results.get("threads=2 spin", next(iter(results.values())))[0]
    print(f"\n| setting | s/step alone | s/step beside a busy process | beside / alone | alone vs threads=2 spin |")
    print("|---|---|---|---|---|")
    for name, (a, b) in results.items():
        print(f"| {name} | {a:.3f} | {b:.3f} | {b / a:.2f} | {a / base:.2f} |")


if __name__ == "__main__":
    main()
