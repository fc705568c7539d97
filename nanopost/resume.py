"""
init_from=resume: the checkpoint a run continues, where its directory is now, and its saved config in
this version's spelling.
"""

import os

from nanopost.checkpoints import check_resumable, read_checkpoint
from nanopost.options import DEFAULTS, MODEL_KEYS, algo_module, check_model_keys, fill_out_dir, renamed
from nanopost.run_dir import PREVIOUS


def resumed(overrides):
    """init_from=resume: (the checkpoint, the overrides it implies): its saved config, changed only by what
    is given again on the command line, and out_dir where the checkpoint is now (a run directory moved
    since writes where it is). Keys that cannot apply to it (model shape, block_size) are errors."""
    out_dir = fill_out_dir(overrides.get("out_dir", DEFAULTS["out_dir"]), overrides.get("algo", DEFAULTS["algo"]))
    ckpt = checkpoint_to_resume(out_dir, overrides)
    check_resumable(ckpt, out_dir)
    check_model_keys(overrides, {**ckpt["model_args"], "block_size": ckpt["config"]["block_size"]},
                     f"the run resumed from {out_dir}", MODEL_KEYS + ("block_size",))
    return ckpt, {**saved_config(ckpt, out_dir), **{k: v for k, v in overrides.items() if k != "init_from"},
                  "out_dir": out_dir}


def saved_config(ckpt, out_dir):
    """A checkpoint's config in this version's spelling: an earlier version's old option that is now a
    variant of the lab resumes as that variant (renamed), and a key no option of the run takes any more
    is dropped, with a note naming it."""
    config = renamed(dict(ckpt["config"]))
    module = algo_module(config.get("algo", DEFAULTS["algo"]))
    known = set(DEFAULTS) | set(module.defaults)
    dropped = sorted(key for key in config if key not in known)
    if dropped:
        print(f"note: {out_dir}/ckpt.pt was written by an earlier version: its config keys {', '.join(dropped)} "
              f"are no option of --algo {config.get('algo', DEFAULTS['algo'])} now; dropped")
    return {key: value for key, value in config.items() if key in known}


def checkpoint_to_resume(out_dir, overrides):
    """The checkpoint init_from=resume continues: out_dir/ckpt.pt, of the --algo given if one is."""
    path = os.path.join(out_dir, "ckpt.pt")
    if not os.path.isfile(path):
        aside = os.path.join(out_dir, PREVIOUS)
        raise FileNotFoundError(f"init_from=resume: no checkpoint at {path}" + (
            f"; {aside} holds the run an --overwrite set aside (killed before its first checkpoint): move its files "
            f"back into {out_dir} to resume it" if os.path.isfile(os.path.join(aside, "ckpt.pt")) else ""))
    ckpt = read_checkpoint(out_dir)
    algo, was = overrides.get("algo"), ckpt["config"]["algo"]
    if algo is not None and algo != was:
        raise ValueError(f"--algo {algo} cannot resume {out_dir}: it is a run of --algo {was}; resume it with --algo "
                         f"{was} (or no --algo), or start a {algo} run from it with --init_from={out_dir} --out_dir=NEW")
    return ckpt
