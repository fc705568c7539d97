"""
The run directory (out_dir): the files a run writes beside its checkpoint (passport.md, samples.txt),
held back until the run's setup has succeeded, so that a setup that fails leaves out_dir as it was.
"""

import os


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
