"""
The run directory (out_dir): the files a run writes beside its checkpoint (passport.md, samples.txt),
held back until the run's setup has succeeded, so that a setup that fails leaves out_dir as it was;
the lock that keeps a second run out of it; and --overwrite's earlier run, kept aside until the new
run has a checkpoint of its own.
"""

import os
import shutil
import socket


def write_out(run, name, text, mode="w"):
    """Rank 0 writes out_dir/name. While the run is set up (run.held, a list, set by train.setup) the
    text waits there and the loop writes it once setup has succeeded: a setup that fails writes nothing
    into out_dir (which may hold an earlier run)."""
    if not run.master:
        return
    if getattr(run, "held", None) is not None:
        run.held.append((name, text, mode))
        return
    with open(os.path.join(run.cfg["out_dir"], name), mode) as f:
        f.write(text)


# One writer per out_dir: rank 0 of a run holds out_dir/train.lock (its pid and host) from its first
# write until it ends. Two runs started together into one out_dir would both pass check_out_dir, then
# interleave metrics.jsonl and replace each other's checkpoints.
LOCK = "train.lock"


def take_lock(out_dir):
    """Create out_dir/train.lock holding this process's pid and host (O_EXCL: one of two runs wins); True."""
    path = os.path.join(out_dir, LOCK)
    try:
        with os.fdopen(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY), "w") as f:
            f.write(f"{os.getpid()} {socket.gethostname()}\n")
    except FileExistsError:
        take_over(out_dir, path)
    return True


def take_over(out_dir, path):
    """A lock already there: refused in one line naming the process that holds it, unless that process no
    longer runs (a killed run's lock: taken over, saying so)."""
    try:
        pid, host = open(path).read().split()
        pid = int(pid)
    except ValueError:  # cut off before its line was written: its run died at once
        pid, host = None, socket.gethostname()
    if host != socket.gethostname() or (pid is not None and alive(pid)):
        raise ValueError(f"--out_dir={out_dir} is in use by another run (pid {pid} on {host}, its lock {path}): wait "
                         f"for it to end, or choose another --out_dir; if no such process runs, delete the lock")
    print(f"note: {path}: taken over from pid {pid}, which no longer runs (it ended without releasing it)")
    os.remove(path)
    take_lock(out_dir)


def alive(pid):
    """Whether process `pid` runs on this machine (signal 0 checks without sending anything)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it runs
        return True
    return True


# --overwrite=True keeps the earlier run until the new one has a checkpoint of its own: its files move
# into out_dir/previous at the start, are dropped at the new run's first checkpoint, and come back if
# the new run ends without one (an error, a NaN, --max_iters=0; not --checkpoint=False, which asked
# for none); after a kill they stay in out_dir/previous.
PREVIOUS = "previous"
RUN_FILES = ("ckpt.pt", "config.json", "metrics.jsonl", "metrics.png", "samples.txt", "passport.md",
             "ladder.json", "ladder_eval.json", "tokens.jsonl", "answers.jsonl", "report.html")


def run_files(directory):
    """The names of the files a run wrote in directory (RUN_FILES, and --fsdp's sharded states)."""
    return [name for name in sorted(os.listdir(directory))
            if name in RUN_FILES or name.startswith("sharded_")] if os.path.isdir(directory) else []


def set_aside(out_dir):
    """Move the earlier run's files into out_dir/previous (replacing what a killed run left there)."""
    previous = os.path.join(out_dir, PREVIOUS)
    shutil.rmtree(previous, ignore_errors=True)
    os.makedirs(previous)
    for name in run_files(out_dir):
        os.replace(os.path.join(out_dir, name), os.path.join(previous, name))
    print(f"overwrite: the run in {out_dir} is kept in {previous} until this run writes its first checkpoint")


def drop_previous(out_dir):
    """The new run has a checkpoint of its own: the run it replaces goes."""
    shutil.rmtree(os.path.join(out_dir, PREVIOUS), ignore_errors=True)


def leave(out_dir, keep_new):
    """A run's end (rank 0): the run --overwrite set aside, if still there, goes (keep_new) or comes back; the lock goes."""
    if os.path.isdir(os.path.join(out_dir, PREVIOUS)):
        drop_previous(out_dir) if keep_new else put_back(out_dir)
    os.remove(os.path.join(out_dir, LOCK))


def put_back(out_dir):
    """The new run ended without a checkpoint: its files go and the earlier run's come back."""
    previous = os.path.join(out_dir, PREVIOUS)
    for name in run_files(out_dir):
        path = os.path.join(out_dir, name)
        if os.path.isdir(path):  # (a sharded state)
            shutil.rmtree(path)
        else:
            os.remove(path)
    for name in os.listdir(previous):
        os.replace(os.path.join(previous, name), os.path.join(out_dir, name))
    os.rmdir(previous)
    print(f"overwrite: this run wrote no checkpoint; the earlier run in {out_dir} is put back")
