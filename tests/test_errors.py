"""Nothing silently wrong, nothing lost, nothing hangs (docs/guarantees.md): every mistake the hostile
user of issue 33 made is one line naming the file, row, field or option and the fix, by family
(configuration, checkpoints, data, sample.py, resume); a run stops at the first non-finite loss,
gradient norm or weight and writes no checkpoint from it; a directory that holds a run is never
overwritten by accident; a resumed run checks that its frozen models are the ones it started with."""

import json
import os
import socket
import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from nanopost import checkpoints as C
from nanopost import options
from nanopost import run_dir
import sample
import sft
import train as T
from conftest import SFT_DATA, TINY
from test_opd import write_checkpoint

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RUN = dict(TINY, **SFT_DATA, algo="sft")


def one_line(error):
    """The error's text, checked to be the one line train.py's `error: ...` prints."""
    text = str(error.value)
    assert "\n" not in text and "Traceback" not in text, text
    return text


def command(script, *args, cwd=ROOT):
    """stderr of `python script args` (a real process: what a user sees), and its exit code."""
    done = subprocess.run([sys.executable, os.path.join(ROOT, script), *args], capture_output=True, text=True,
                          cwd=cwd, env=dict(os.environ, OMP_NUM_THREADS="1"), timeout=120)
    return done.stderr.strip(), done.returncode


@pytest.fixture(scope="module")
def policy(tmp_path_factory):
    """A tiny SFT checkpoint (a train.py run: config, iteration, tokenizer)."""
    out = str(tmp_path_factory.mktemp("errors") / "sft")
    T.train(dict(RUN, max_iters=2, out_dir=out))
    return out


# ----------------------------------------------------------------------------------------------
# Configuration: every numeric option range-checked where it is read

def test_every_numeric_option_has_a_range():
    """A new numeric option needs a line in options.RANGES: none goes unchecked."""
    for algo in options.ALGOS:
        cfg = options.make_config({"algo": algo})
        unranged = [k for k, v in cfg.items() if isinstance(v, (int, float)) and not isinstance(v, bool)
                    and k not in options.RANGES]
        assert not unranged, f"--algo {algo}: {unranged} have no range in options.RANGES"


@pytest.mark.parametrize("args,message", [
    (["--log_interval=0"], "--log_interval=0 is out of range: it must be >= 1"),
    (["--gradient_accumulation_steps=0"], "--gradient_accumulation_steps=0 is out of range: it must be >= 1"),
    (["--batch_size=0"], "--batch_size=0 is out of range: it must be >= 1"),
    (["--max_new_tokens=0"], "--max_new_tokens=0 is out of range: it must be >= 1"),
    (["--n_head=3"], "--n_head=3 does not divide n_embd=128 .*choose n_head from 1, 2, 4, 8, 16, 32"),
    (["--algo=grpo", "--temperature=0"], r"--temperature=0.0 is out of range: it must be > 0 \(its samples are scored"),
    (["--algo=ppo", "--temperature=-1"], "--temperature=-1.0 is out of range: it must be > 0"),
    (["--algo=opd", "--temperature=0"], "--temperature=0.0 is out of range"),
    (["--algo=rft", "--temperature=0"], "--temperature=0.0 is out of range"),
    (["--algo=dpo", "--pair_temperature=0"], "--pair_temperature=0.0 is out of range: it must be > 0"),
    (["--learning_rate=1e999"], "--learning_rate=inf is out of range: it must be finite"),
    (["--min_lr=-0.05"], "--min_lr=-0.05 is out of range: it must be >= 0"),
    (["--learning_rate=1e-4"], r"--min_lr=0.0002 is out of range: it must be <= learning_rate=0.0001 .*--min_lr=1e-05"),
    (["--dropout=1.0"], r"--dropout=1.0 is out of range: it must lie in \[0, 1\)"),
    (["--algo=grpo", "--clip_eps=1.5"], r"--clip_eps=1.5 is out of range: it must lie in \[0, 1\]"),
    (["--out_dir=runs/{x"], r"--out_dir='runs/\{x': a brace may only be part of \{algo\}"),
    (["--algo=dpo", "--data=d.jsonl", "--pairs=style"], "--pairs='style' cannot apply with --data=d.jsonl: .*drop it"),
    (["--algo=grpo", "--gradient_accumulation_steps=4"], "--gradient_accumulation_steps cannot apply to --algo grpo"),
    (["--algo=cispo", "--gradient_accumulation_steps=4"], "--gradient_accumulation_steps cannot apply to --algo cispo"),
    (["--algo=opd", "--gradient_accumulation_steps=2"], "--gradient_accumulation_steps cannot apply to --algo opd"),
])
def test_config_errors_name_the_option_its_value_and_range(args, message):
    with pytest.raises(ValueError, match=message) as e:
        options.make_config(options.parse_args(args))
    one_line(e)


def test_zero_keeps_its_documented_meaning():
    """0 where an option's comment gives it a meaning stays valid (eval_interval=0: never; ...)."""
    options.make_config(dict(eval_interval=0, lora_rank=0, grad_clip=0.0, eval_samples=0, max_tool_calls=0,
                             warmup_iters=0, lr_decay_iters=0, max_iters=0, learning_rate=0.0, min_lr=0.0))


def test_the_command_line_prints_one_line(tmp_path):
    """The same errors through train.py's `error: ...`: exit 1, one line, no traceback."""
    for args, message in [(["--algo", "grpo", "--temperature=0"], "--temperature=0.0 is out of range"),
                          (["--out_dir=a{b"], "a brace may only be part of {algo}"),
                          *([(["--device=cuda"], "--device=cuda: this machine has no such device")]
                            if not torch.cuda.is_available() else [])]:
        err, code = command("train.py", *args, cwd=tmp_path)
        assert code == 1 and err.startswith("error: ") and message in err and "\n" not in err, err


def test_model_keys_that_cannot_apply_are_errors_and_config_json_records_the_real_shape(policy, tmp_path):
    """With a checkpoint start the shape is the checkpoint's: a different n_layer is an error (it was
    ignored and recorded), the same one is fine; config.json records the model that ran (2 x 32, not
    the defaults 4 x 128)."""
    with pytest.raises(ValueError, match=rf"--n_layer=8 cannot apply: init_from={policy} has n_layer=2") as e:
        T.train(dict(RUN, init_from=policy, n_layer=8, out_dir=str(tmp_path / "a")))
    one_line(e)
    assert not os.path.exists(tmp_path / "a")  # nothing written
    shape = {k: v for k, v in RUN.items() if k not in options.MODEL_KEYS}
    T.train(dict(shape, init_from=policy, n_layer=2, max_iters=1, out_dir=str(tmp_path / "b")))
    cfg = json.load(open(tmp_path / "b" / "config.json"))
    assert (cfg["n_layer"], cfg["n_head"], cfg["n_embd"]) == (2, 2, 32)


# ----------------------------------------------------------------------------------------------
# A run stops at the first non-finite loss, gradient norm or weight; no checkpoint comes of it

def test_a_nan_loss_stops_the_run_and_the_last_good_checkpoint_stays(tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    real = sft.loss
    calls = {"n": 0}

    def nan_loss(run, state, model, batch):
        loss_sum, count, metrics = real(run, state, model, batch)
        calls["n"] += 1
        return (loss_sum * float("nan") if calls["n"] > 2 else loss_sum), count, metrics  # from iteration 3
    monkeypatch.setattr(sft, "loss", nan_loss)
    with pytest.raises(ValueError, match=r"iteration 3: the loss is nan, so the step was not applied: training "
                                         r"stopped, and no checkpoint was written from it") as e:
        T.train(dict(RUN, max_iters=4, eval_interval=2, eval_problems=4, out_dir=out))
    one_line(e)
    ckpt = C.read_checkpoint(out)
    assert ckpt["iter"] == 2 and all(torch.isfinite(v).all() for v in ckpt["model"].values())


@pytest.mark.parametrize("lr,where", [(1e30, "iteration 2: the loss is nan"),
                                      (1e39, "iteration 1: the weights are no longer finite")])
def test_a_huge_learning_rate_stops_the_run_without_a_nan_checkpoint(tmp_path, lr, where):
    """1e30: the first step's weights are huge but finite (checkpointed), the second loss is NaN: the
    run stops there. 1e39: the first update itself overflows the weights: no checkpoint at all."""
    out = str(tmp_path / "run")
    with pytest.raises(ValueError, match=where) as e:
        T.train(dict(RUN, learning_rate=lr, min_lr=0.0, warmup_iters=0, max_iters=4, eval_interval=1,
                     eval_problems=4, out_dir=out))
    one_line(e)
    if lr < 1e38:
        ckpt = C.read_checkpoint(out)
        assert ckpt["iter"] == 1 and all(torch.isfinite(v).all() for v in ckpt["model"].values())
    else:
        assert not os.path.exists(os.path.join(out, "ckpt.pt"))


# ----------------------------------------------------------------------------------------------
# A directory that holds a run is never overwritten by accident

def test_an_out_dir_that_holds_a_run_is_refused_unless_told(policy, tmp_path):
    out = str(tmp_path / "run")
    T.train(dict(RUN, max_iters=3, out_dir=out))
    before = {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)}
    with pytest.raises(ValueError, match=rf"--out_dir={out} holds a run \(its ckpt.pt\): pass --init_from=resume "
                                         r"to continue it, --overwrite=True to replace it") as e:
        T.train(dict(RUN, max_iters=1, out_dir=out))
    one_line(e)
    with pytest.raises(ValueError, match=rf"--out_dir={policy} is also --init_from: the run would write over"):
        T.train(dict(RUN, init_from=policy, max_iters=1, out_dir=policy, overwrite=True))
    # a run told to overwrite, whose setup fails (a bad data file), writes nothing there
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "q"}\n' * 4)
    with pytest.raises(ValueError, match="row 1: field 'completion'"):
        T.train(dict(RUN, data=str(bad), max_iters=1, out_dir=out, overwrite=True))
    assert {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)} == before
    T.train(dict(RUN, max_iters=1, out_dir=out, overwrite=True))  # told: replaced
    assert C.read_checkpoint(out)["iter"] == 1
    assert len(open(os.path.join(out, "metrics.jsonl")).readlines()) == 1


# ----------------------------------------------------------------------------------------------
# Checkpoints

@pytest.mark.parametrize("content,message", [
    ("truncated", r"ckpt.pt: cannot be read \(PytorchStreamReader failed.*\): it is truncated, empty or not a file"),
    ("empty", r"ckpt.pt: cannot be read .*: it is truncated, empty or not a file torch.save wrote"),
    ("state_dict", r"ckpt.pt: not a checkpoint of train.py \(a dict of 'w', no model_args\)"),
    ("tensor", r"ckpt.pt: not a checkpoint of train.py \(a Tensor, no model_args\)"),
])
def test_a_broken_or_foreign_checkpoint_is_one_line(policy, tmp_path, content, message):
    directory = tmp_path / content
    os.makedirs(directory)
    path = directory / "ckpt.pt"
    if content == "truncated":
        data = open(os.path.join(policy, "ckpt.pt"), "rb").read()
        path.write_bytes(data[:len(data) // 2])
    elif content == "empty":
        path.write_bytes(b"")
    else:
        torch.save({"w": torch.zeros(2)} if content == "state_dict" else torch.zeros(2), path)
    for load in (C.read_checkpoint, C.load_model, C.load_tokenizer):
        with pytest.raises(ValueError, match=message) as e:
            load(str(directory))
        one_line(e)
    with pytest.raises(ValueError, match=message):  # as a run's start
        T.train(dict(RUN, init_from=str(directory), out_dir=str(tmp_path / "run")))


# ----------------------------------------------------------------------------------------------
# Data

def test_non_utf8_data_names_file_and_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "a", "completion": "b"}\n{"prompt": "caf\xe9", "completion": "b"}\n')
    with pytest.raises(ValueError, match=r"d\.jsonl: line 2: not UTF-8 \(byte 0xe9\): save the file as UTF-8") as e:
        T.train(dict(RUN, data=str(path), out_dir=str(tmp_path / "run")))
    one_line(e)


def test_a_local_path_that_does_not_exist_is_no_such_file_never_the_hub(policy, tmp_path, monkeypatch):
    """--data=p/nothere.txt and --init_from=out/sftt once asked the hub (27 s, a ConnectionError)."""
    monkeypatch.chdir(os.path.dirname(policy))  # out/sft exists here as ./sft
    with pytest.raises(FileNotFoundError, match=r"data file p/nothere.txt: no such file") as e:
        T.train(dict(RUN, data="p/nothere.txt", out_dir=str(tmp_path / "a")))
    one_line(e)
    with pytest.raises(FileNotFoundError, match=r"init_from=\./sftt: no such directory; did you mean \./sft\?"):
        T.train(dict(RUN, init_from="./sftt", out_dir=str(tmp_path / "b")))
    os.makedirs("out/sft")  # a first component that exists: out/sftt is a local path
    with pytest.raises(FileNotFoundError, match=r"init_from=out/sftt: no such directory; did you mean out/sft\?"):
        T.train(dict(RUN, init_from="out/sftt", out_dir=str(tmp_path / "c")))
    with pytest.raises(FileNotFoundError, match=r"tokenizer=out/tok: no such directory"):
        T.train(dict(RUN, tokenizer="out/tok", out_dir=str(tmp_path / "d")))
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")


@pytest.mark.parametrize("algo,row,field", [
    ("sft", {"prompt": "x" * 300, "completion": "Answer: 3"}, "prompt"),
    ("sft", {"prompt": "q", "completion": "x" * 300}, "completion"),
    ("dpo", {"prompt": "x" * 300, "chosen": "a", "rejected": "b"}, "prompt"),
])
def test_a_long_row_names_the_field_that_is_long(tmp_path, algo, row, field):
    """A prompt that alone fills block_size is named as the prompt (it was blamed on `completion`)."""
    good = {"prompt": "What is 1 + 2?", "completion": "Answer: 3"} if algo == "sft" else \
        {"prompt": "What is 1 + 2?", "chosen": "Answer: 3", "rejected": "Answer: 4"}
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in [good, row, good, good]) + "\n")
    with pytest.raises(ValueError, match=rf"d\.jsonl: row 2: field '{field}': .*block_size") as e:
        T.train(dict(TINY, **(SFT_DATA if algo == "sft" else {}), algo=algo, data=str(path), out_dir=str(tmp_path / "run")))
    one_line(e)


# ----------------------------------------------------------------------------------------------
# sample.py

def test_sample_says_what_it_loaded_and_its_errors_are_one_line(policy, tmp_path, capsys):
    sample.main([policy, "What is 1 + 2 + 3 + 4?", "--max_new_tokens=4"])
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"{policy}: --algo sft on env=arithmetic, iteration 2"
    with pytest.raises(ValueError, match=r"the question is 100,0\d\d tokens with its template; .* reads at most "
                                         r"block_size=128 .*: shorten it") as e:
        sample.main([policy, "x" * 100_000])
    one_line(e)
    rm = str(tmp_path / "rm")
    T.train(dict(TINY, algo="rm", init_from=policy, train_prompts=8, heldout_prompts=4, max_iters=1, out_dir=rm))
    with pytest.raises(ValueError, match=rf"{rm} is a reward model \(--algo rm\): it scores answers and writes none") as e:
        sample.main([rm, "What is 1 + 2?"])
    one_line(e)
    err, code = command("sample.py", str(tmp_path / "nowhere"), "What is 1 + 2?")  # the printed form
    assert code == 1 and err == f"error: no checkpoint at {tmp_path / 'nowhere' / 'ckpt.pt'}"


def test_sample_runs_the_environments_tool(tmp_path, monkeypatch, capsys):
    """A calculator checkpoint's call gets its result, through the rollouts' own tool hook."""
    out = str(tmp_path / "calc")
    T.train(dict(RUN, env="calculator", max_iters=1, out_dir=out))
    seen = []

    def generate(model, prompts, max_new_tokens, temperature=1.0, top_k=None, top_p=None, stop_tokens=(), seed=None,
                 pad_id=0, tool_hook=None):
        tok = C.load_tokenizer(out)
        call = [tok.special["tool_call"]] + tok.encode("347*28") + [tok.special["/tool_call"]]
        seen.append(tok.decode(tool_hook(0, call)))
        return [call], [[0.0] * len(call)], [[0] * len(call)]
    monkeypatch.setattr(sample, "sample", generate)
    capsys.readouterr()
    sample.main([out, "What is 347*28?"])
    assert "9716" in seen[0] and "env=calculator" in capsys.readouterr().out.splitlines()[0]


# ----------------------------------------------------------------------------------------------
# Resume

def test_a_torn_last_metrics_line_is_dropped_with_a_note(tmp_path, capsys):
    out = str(tmp_path / "run")
    T.train(dict(RUN, max_iters=2, out_dir=out))
    with open(os.path.join(out, "metrics.jsonl"), "a") as f:
        f.write('{"iter": 3, "lo')  # a kill mid-write
    T.train(dict(init_from="resume", out_dir=out, max_iters=3))
    assert f"note: {out}/metrics.jsonl: its last line was cut off mid-write" in capsys.readouterr().out
    rows = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [r["iter"] for r in rows] == [1, 2, 3]


def test_a_resume_on_another_world_size_says_the_global_batch_changed(capsys):
    run = SimpleNamespace(world_size=1, rank=0, master=True, device="cpu",
                          cfg=dict(seed=1, batch_size=8, gradient_accumulation_steps=2))
    C.restore_rng(run, [None, None], it=4)
    assert ("written by 2 rank(s), this run has 1: the global batch changes from 32 to 16 rows per step"
            in capsys.readouterr().out)
    run.cfg["prompts_per_iter"] = 16  # (grpo, opd: the batch is global)
    C.restore_rng(run, [None, None], it=4)
    assert "the global batch stays prompts_per_iter=16 prompts" in capsys.readouterr().out


def test_a_whole_checkpoint_under_fsdp_is_one_line(policy):
    ckpt = C.read_checkpoint(policy)
    with pytest.raises(ValueError, match=rf"{policy}/ckpt.pt was written without --fsdp: resume it with "
                                         r"--fsdp=False .*--init_from=") as e:
        C.check_resumable(ckpt, policy, SimpleNamespace(fsdp=True))
    one_line(e)
    C.check_resumable(ckpt, policy, SimpleNamespace(fsdp=False))


def test_resume_refuses_other_model_keys(tmp_path):
    out = str(tmp_path / "run")
    T.train(dict(RUN, max_iters=1, out_dir=out))
    with pytest.raises(ValueError, match=rf"--n_embd=64 cannot apply: the run resumed from {out} has n_embd=32"):
        T.train(dict(init_from="resume", out_dir=out, max_iters=2, n_embd=64))


def test_a_resumed_run_checks_its_frozen_models(tmp_path):
    """GRPO's reference is rebuilt from init_from on resume: retrained there since, it is an error
    naming the directory (it was silently another reference)."""
    start = write_checkpoint(tmp_path / "start", seed=0)
    out = str(tmp_path / "run")
    rl = dict(TINY, algo="grpo", prompts_per_iter=4, group_size=2, max_new_tokens=8, eval_problems=4)
    T.train(dict(rl, init_from=start, max_iters=1, out_dir=out))
    frozen = C.read_checkpoint(out)["frozen"]
    assert frozen["reference"]["directory"] == start and len(frozen["reference"]["fingerprint"]) == 64
    T.train(dict(init_from="resume", out_dir=out, max_iters=2))  # unchanged: resumes
    write_checkpoint(tmp_path / "start", seed=1)  # the start directory retrained
    with pytest.raises(ValueError, match=rf"resume: the reference in {start} is not the one this run started "
                                         rf"with \(its weights changed since\): restore {start} as it was") as e:
        T.train(dict(init_from="resume", out_dir=out, max_iters=3))
    one_line(e)


# ----------------------------------------------------------------------------------------------
# Nothing lost (issue 48): --overwrite keeps the earlier run until the new one has a checkpoint, one
# writer per out_dir, checksummed checkpoints, a full disk

def test_overwrite_keeps_the_earlier_run_until_the_new_one_has_a_checkpoint(tmp_path, monkeypatch, capsys):
    """The earlier run waits in out_dir/previous while the new one runs; a new run that ends without a
    checkpoint of its own (a NaN, max_iters=0) puts it back as it was; one that writes a checkpoint, or
    finishes under --checkpoint=False, replaces it."""
    out = str(tmp_path / "run")
    T.train(dict(RUN, max_iters=2, out_dir=out))
    open(os.path.join(out, "ladder.json"), "w").write('{"stage": "sft"}')  # (as if a ladder stage)
    before = {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)}
    seen, real = [], sft.loss

    def nan_loss(run, state, model, batch):
        seen.append(sorted(os.listdir(out)))
        loss_sum, count, metrics = real(run, state, model, batch)
        return loss_sum * float("nan"), count, metrics
    monkeypatch.setattr(sft, "loss", nan_loss)
    with pytest.raises(ValueError, match="iteration 1: the loss is nan"):
        T.train(dict(RUN, max_iters=2, out_dir=out, overwrite=True))
    assert "ckpt.pt" not in seen[0] and "previous" in seen[0] and "train.lock" in seen[0]  # aside, and locked
    assert {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)} == before  # put back
    printed = capsys.readouterr().out
    assert f"the run in {out} is kept in {os.path.join(out, 'previous')} until this run writes its first checkpoint" in printed
    assert f"the earlier run in {out} is put back" in printed
    monkeypatch.setattr(sft, "loss", real)
    T.train(dict(RUN, max_iters=0, out_dir=out, overwrite=True))
    assert {name: open(os.path.join(out, name), "rb").read() for name in os.listdir(out)} == before  # (lock released)
    T.train(dict(RUN, max_iters=1, out_dir=out, overwrite=True))
    assert C.read_checkpoint(out)["iter"] == 1 and not os.path.exists(os.path.join(out, "previous"))
    assert not os.path.exists(os.path.join(out, "ladder.json"))  # a run by hand is no longer the ladder's stage
    T.train(dict(RUN, max_iters=1, checkpoint=False, out_dir=out, overwrite=True))  # finished: it replaced it
    assert sorted(os.listdir(out)) == ["config.json", "metrics.jsonl", "passport.md"]
    # a kill before the first checkpoint leaves the earlier run in out_dir/previous: said by a start and a resume
    T.train(dict(RUN, max_iters=1, out_dir=out, overwrite=True))
    run_dir.set_aside(out)  # (as a run killed at once would have left it)
    with pytest.raises(ValueError, match=rf"--out_dir={out} holds a run in {out}/previous \(set aside by an --overwrite "
                                         r"run killed before its first checkpoint\): move it back to keep it") as e:
        T.train(dict(RUN, max_iters=1, out_dir=out))
    one_line(e)
    with pytest.raises(FileNotFoundError, match=rf"; {out}/previous holds the run an --overwrite set aside"):
        T.train(dict(init_from="resume", out_dir=out))


def test_a_second_writer_is_refused_and_a_stale_lock_is_taken_over(tmp_path, capsys):
    out = str(tmp_path / "run")
    os.makedirs(out)
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    try:
        with open(os.path.join(out, "train.lock"), "w") as f:
            f.write(f"{holder.pid} {socket.gethostname()}\n")
        with pytest.raises(ValueError, match=rf"--out_dir={out} is in use by another run \(pid {holder.pid} on "
                                             rf"{socket.gethostname()}, its lock {out}/train.lock\)") as e:
            T.train(dict(RUN, max_iters=1, out_dir=out))
        one_line(e)
        assert os.listdir(out) == ["train.lock"]  # nothing written, the holder's lock kept
    finally:
        holder.kill()
        holder.wait()
    T.train(dict(RUN, max_iters=1, out_dir=out))  # the holder is gone: its lock is stale
    assert f"note: {out}/train.lock: taken over from pid {holder.pid}, which no longer runs" in capsys.readouterr().out
    assert C.read_checkpoint(out)["iter"] == 1 and "train.lock" not in os.listdir(out)  # released at the end


def test_a_flipped_bit_in_a_checkpoint_is_one_line(policy, tmp_path):
    data = bytearray(open(os.path.join(policy, "ckpt.pt"), "rb").read())
    weight = C.read_checkpoint(policy)["model"]["transformer.h.0.attn.c_attn.weight"]
    at = bytes(data).find(weight.numpy().tobytes()[:64])
    assert at > 0
    data[at + 10] ^= 0x04  # one bit of one weight
    os.makedirs(tmp_path / "flipped")
    (tmp_path / "flipped" / "ckpt.pt").write_bytes(bytes(data))
    message = rf"{tmp_path}/flipped/ckpt.pt: its contents do not match the checksum saved with them"
    for load in (C.read_checkpoint, C.load_model):
        with pytest.raises(ValueError, match=message) as e:
            load(str(tmp_path / "flipped"))
        one_line(e)
    with pytest.raises(ValueError, match=message):
        T.train(dict(init_from="resume", out_dir=str(tmp_path / "flipped")))


def test_a_full_disk_keeps_the_earlier_checkpoint_and_removes_the_partial_file(tmp_path, monkeypatch):
    out = str(tmp_path / "run")
    real = torch.save

    def full_disk(obj, path):  # the first checkpoint is written, the disk is full at the second
        if obj["iter"] == 2:
            open(path, "wb").write(b"partial")
            raise OSError(28, "No space left on device")
        real(obj, path)
    monkeypatch.setattr(torch, "save", full_disk)
    with pytest.raises(ValueError, match=rf"{out}/ckpt.pt: the checkpoint of iteration 2 could not be written "
                                         r"\(\[Errno 28\] No space left on device\): free space on that disk") as e:
        T.train(dict(RUN, max_iters=2, eval_interval=1, eval_problems=4, out_dir=out))
    one_line(e)
    assert C.read_checkpoint(out)["iter"] == 1 and "ckpt.pt.tmp" not in os.listdir(out)


# ----------------------------------------------------------------------------------------------
# One line naming the file and the fix (issue 48)

def test_the_default_block_size_yields_to_a_shorter_checkpoint_and_says_so(tmp_path, capsys):
    short = str(tmp_path / "short")
    T.train(dict(RUN, block_size=112, max_iters=1, out_dir=short))
    T.train(dict(RUN, init_from=short, max_iters=1, out_dir=str(tmp_path / "next")))  # (RUN's block_size: the default)
    assert json.load(open(tmp_path / "next" / "config.json"))["block_size"] == 112
    assert f"note: block_size=128 -> 112, the positions of init_from={short}" in capsys.readouterr().out


def test_start_and_resume_mistakes_are_one_line(policy, tmp_path):
    with pytest.raises(ValueError, match=rf"--algo grpo cannot resume {policy}: it is a run of --algo sft; resume "
                                         r"it with --algo sft \(or no --algo\), or start a grpo run from it") as e:
        T.train(dict(algo="grpo", init_from="resume", out_dir=policy))
    one_line(e)
    with pytest.raises(ValueError, match=rf"--block_size=256 cannot apply: init_from={policy} has 128 positions") as e:
        T.train(dict(RUN, init_from=policy, block_size=256, out_dir=str(tmp_path / "long")))
    one_line(e)
    with pytest.raises(ValueError, match=rf"--block_size=64 cannot apply: the run resumed from {policy} has "
                                         r"block_size=128"):
        T.train(dict(init_from="resume", out_dir=policy, block_size=64))
    no_ckpt = str(tmp_path / "no_ckpt")
    T.train(dict(RUN, max_iters=1, checkpoint=False, out_dir=no_ckpt))  # config.json, no ckpt.pt
    with pytest.raises(FileNotFoundError, match=rf"init_from={no_ckpt}: a train.py run's directory \(its config.json\) "
                                                r"without ckpt.pt") as e:
        T.train(dict(RUN, init_from=no_ckpt, out_dir=str(tmp_path / "next")))
    one_line(e)
    assert options.check_start(dict(algo="sft")) == ("sft: starting from scratch (a randomly initialised 4-layer "
                                                     "model); pass --init_from=DIR to start from a checkpoint")
    assert options.check_start(dict(algo="sft", init_from=policy)) is None


def test_broken_config_files_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("batch_size = 4\nmax_iters = (10\n")
    err, code = command("train.py", str(bad), cwd=tmp_path)
    assert code == 1 and err.startswith(f"error: {bad}, line 2: ") and "fix that line" in err and "\n" not in err, err
    stage = tmp_path / "out" / "sft"
    os.makedirs(stage)
    for name, text in (("ckpt.pt", ""), ("ladder.json", "{}"), ("config.json", '{"algo": "sft",')):
        (stage / name).write_text(text)
    with pytest.raises(ValueError, match=rf"{stage}/config.json: line 1: invalid JSON .*: restore it") as e:
        options.ladder_stage(str(tmp_path / "out"), "sft", "arithmetic")
    one_line(e)


@pytest.mark.parametrize("option,message", [
    ("--temperature=-1", "--temperature=-1.0 is out of range: it must be finite and >= 0"),
    ("--temperature=nan", "--temperature=nan is out of range"), ("--temperature=inf", "--temperature=inf is out"),
    ("--n=0", "--n=0 is out of range: it must be >= 1"), ("--max_new_tokens=-1", "--max_new_tokens=-1 is out"),
])
def test_sample_options_are_range_checked(policy, option, message):
    with pytest.raises(ValueError, match=message) as e:
        sample.main([policy, "What is 1 + 2?", option])
    one_line(e)
