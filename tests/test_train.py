"""The shared loop: configuration, loss normalisation under DDP and accumulation, exact resume,
checkpoints, data files and the SFT loss mask."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from nanopost import checkpoints as C
from nanopost import options, resume, usage
import train as T
from nanopost.checkpoints import build_model, checksum, load_model
from conftest import SFT_DATA, TINY, run_ddp
from nanopost.data import load_rows
import sft
from sft import masked_nll
from nanopost.tokenizer import Tokenizer


# -- configuration -----------------------------------------------------------------------------

def test_config_overrides_and_types():
    cfg = options.make_config(options.parse_args(["--algo", "sft", "--batch_size=8", "--learning_rate=1e-3",
                                      "--out_dir=/tmp/x", "--bias=False", "--lora_alpha=4"]))
    assert (cfg["batch_size"], cfg["learning_rate"], cfg["bias"], cfg["lora_alpha"]) == (8, 1e-3, False, 4.0)
    assert cfg["out_dir"] == "/tmp/x" and options.make_config({"algo": "pretrain"})["out_dir"] == "out/pretrain"


def test_config_file(tmp_path):
    path = tmp_path / "x.py"
    path.write_text("batch_size = 3\nmax_iters = 7\n")
    cfg = options.make_config(options.parse_args([str(path), "--max_iters=9"]))
    assert (cfg["batch_size"], cfg["max_iters"]) == (3, 9)


@pytest.mark.parametrize("args,message", [
    (["--batch_sise=4"], "unknown config key 'batch_sise'.*did you mean batch_size"),
    (["--batch_size=4.5"], "'batch_size' expects int, got 4.5"),
    (["--bias=1"], "'bias' expects bool"),
    (["--learning_rate=fast"], "'learning_rate' expects float"),
    (["--algo=dpp"], "unknown algo 'dpp'.*dpo"),
])
def test_config_errors_name_the_key(args, message):
    with pytest.raises(ValueError, match=message):
        options.make_config(options.parse_args(args))


# -- the loop: same global batch, same gradient ----------------------------------------------------

def _final_weights(overrides):
    run = T.train(overrides)
    return {k: v.detach().clone() for k, v in run.raw_model.state_dict().items()}


def test_ddp_and_accumulation_equal_one_process(tmp_path):
    """1 process x 4 micro-batches, 2 processes x 2 and 1 x 1 (batch 4x) on the same global batch
    take the same optimizer steps; both DDP ranks end with identical weights."""
    base = dict(TINY, **SFT_DATA, algo="sft", max_iters=2, checkpoint=False, dropout=0.0)
    one_by_four = _final_weights(dict(base, out_dir=str(tmp_path / "a"), batch_size=2, gradient_accumulation_steps=4))
    one_by_one = _final_weights(dict(base, out_dir=str(tmp_path / "b"), batch_size=8, gradient_accumulation_steps=1))
    ranks = run_ddp(_final_weights, dict(base, out_dir=str(tmp_path / "c"), batch_size=2, gradient_accumulation_steps=2))
    for k in one_by_four:
        torch.testing.assert_close(one_by_one[k], one_by_four[k], atol=2e-5, rtol=0)
        torch.testing.assert_close(ranks[0][k], one_by_four[k], atol=2e-5, rtol=0)
        assert torch.equal(ranks[0][k], ranks[1][k]), f"ranks disagree on {k}"
    assert any(not torch.equal(v, build_model(options.make_config(base), Tokenizer()).state_dict()[k])
               for k, v in one_by_four.items())  # training moved the weights


def interrupt_at(monkeypatch, iteration, seen):
    """sft's batches, sending this process a Ctrl-C (SIGINT) during `iteration` (0-based); `seen` gets
    the SIGINT handler in force right after it (the default: a second Ctrl-C stops at once)."""
    real = sft.batches

    def batches(run, state, it):
        if it == iteration:
            os.kill(os.getpid(), signal.SIGINT)
            seen.append(signal.getsignal(signal.SIGINT))
        return real(run, state, it)
    monkeypatch.setattr(sft, "batches", batches)


def test_resume_equals_uninterrupted(tmp_path, monkeypatch):
    """k steps, a Ctrl-C, resume to N == N steps straight, the schedule not pinned (dropout on: the RNG
    state is restored too). The Ctrl-C saves a checkpoint at the end of its step (no evaluation was due)
    and says how to resume; a second one would stop at once."""
    base = dict(TINY, **SFT_DATA, algo="sft", dropout=0.1, max_iters=6)
    straight = _final_weights(dict(base, out_dir=str(tmp_path / "a")))
    out, seen, before = str(tmp_path / "b"), [], signal.getsignal(signal.SIGINT)
    interrupt_at(monkeypatch, 2, seen)
    with pytest.raises(T.Stopped, match=rf"^SIGINT at iteration 3: saved {out}/ckpt.pt; resume with: python train.py "
                                        rf"--init_from=resume --out_dir={out}$"):
        T.train(dict(base, out_dir=out))
    assert seen == [signal.default_int_handler] and signal.getsignal(signal.SIGINT) is before  # (restored after)
    assert C.read_checkpoint(out)["iter"] == 3
    monkeypatch.undo()
    resumed = _final_weights(dict(init_from="resume", out_dir=out, device="cpu"))
    for k in straight:
        assert torch.equal(straight[k], resumed[k]), k
    rows = [json.loads(line) for line in open(tmp_path / "b" / "metrics.jsonl")]
    assert [r["iter"] for r in rows if "loss" in r] == list(range(1, 7))  # no duplicated or missing lines


def _stopped_by_rank_0(overrides):
    """(run in each of two processes) A Ctrl-C reaching rank 0 alone, during iteration 2: what each rank raised."""
    real = sft.batches

    def batches(run, state, it):
        if it == 1 and run.rank == 0:
            os.kill(os.getpid(), signal.SIGINT)
        return real(run, state, it)
    sft.batches = batches
    try:
        T.train(overrides)
    except T.Stopped as e:
        return str(e)


def test_under_ddp_every_rank_stops_at_the_step_a_signal_reached_one(tmp_path):
    """A Ctrl-C that reaches one rank stops all of them after the same step, with one checkpoint (its
    writing is collective: ranks that disagreed would hang)."""
    out = str(tmp_path / "ddp")
    said = run_ddp(_stopped_by_rank_0, dict(TINY, **SFT_DATA, algo="sft", max_iters=6, out_dir=out))
    assert said == [f"SIGINT at iteration 2: saved {out}/ckpt.pt; resume with: python train.py --init_from=resume "
                    f"--out_dir={out}", f"a signal at iteration 2: saved {out}/ckpt.pt; resume with: python train.py "
                    f"--init_from=resume --out_dir={out}"]
    assert C.read_checkpoint(out)["iter"] == 2 and len(C.read_checkpoint(out)["rng"]) == 2


def test_a_longer_resume_keeps_the_schedule_it_started_with(tmp_path):
    """The schedule's length (lr_decay_iters=0: max_iters) is recorded at the first start: a resume that
    asks for more iterations follows it, then holds min_lr; it never stretches the cosine mid-run."""
    base = dict(TINY, **SFT_DATA, algo="sft", warmup_iters=1)
    lrs = lambda out: [r["lr"] for r in map(json.loads, open(os.path.join(out, "metrics.jsonl"))) if "lr" in r]
    T.train(dict(base, max_iters=3, out_dir=str(tmp_path / "short")))
    assert json.load(open(tmp_path / "short" / "config.json"))["lr_decay_iters"] == 3
    T.train(dict(base, max_iters=6, out_dir=str(tmp_path / "long")))
    T.train(dict(init_from="resume", out_dir=str(tmp_path / "short"), max_iters=6))
    cfg = options.make_config(dict(base, max_iters=3))
    assert lrs(tmp_path / "short") == [T.lr_at(cfg, it) for it in range(3)] + [cfg["min_lr"]] * 3
    assert lrs(tmp_path / "long")[3] > cfg["min_lr"]  # (what a stretched schedule would have given instead)


def test_a_moved_run_directory_resumes_where_it_is(tmp_path, monkeypatch):
    """The out_dir recorded in the checkpoint is where the run was: a resume writes where it is now."""
    monkeypatch.chdir(tmp_path)
    T.train(dict(TINY, **SFT_DATA, algo="sft", max_iters=2, out_dir="first"))
    os.makedirs("out")
    os.rename("first", "out/sft")  # the default --out_dir of --algo sft
    run = T.train(dict(init_from="resume", max_iters=3))
    assert run.cfg["out_dir"] == "out/sft" and not os.path.exists("first")
    assert C.read_checkpoint("out/sft")["iter"] == 3


@pytest.mark.parametrize("sent", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_on_the_command_line_saves_and_prints_the_resume_command(tmp_path, sent):
    """A real process: the first Ctrl-C (or SIGTERM) ends it at a step boundary with a checkpoint and the command that
    resumes (exit 130), in one line after the progress bar, no traceback."""
    out = tmp_path / "run"
    args = [f"--{k}={v}" for k, v in dict(TINY, **SFT_DATA, max_iters=100_000, out_dir=str(out)).items()]
    process = subprocess.Popen([sys.executable, os.path.join(ROOT, "train.py"), *args], stderr=subprocess.PIPE,
                               stdout=subprocess.DEVNULL, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    deadline = time.time() + 120
    while not (out / "metrics.jsonl").exists() or not (out / "metrics.jsonl").read_text().count("loss"):
        assert time.time() < deadline and process.poll() is None, "the run did not start"
        time.sleep(0.2)
    process.send_signal(sent)
    err = process.communicate(timeout=120)[1]
    last = err.strip().splitlines()[-1]
    assert process.returncode == 130 and "Traceback" not in err, err
    it = C.read_checkpoint(str(out))["iter"]
    assert last == f"{sent.name} at iteration {it}: saved {out}/ckpt.pt; resume with: python train.py --init_from=resume --out_dir={out}"


def test_checkpoint_is_atomic_and_loadable_with_lora(tmp_path):
    out = tmp_path / "lora"
    T.train(dict(TINY, **SFT_DATA, algo="sft", out_dir=str(out), lora_rank=2, max_iters=2, eval_interval=2, plot=True))
    # no .tmp left behind
    assert sorted(os.listdir(out)) == ["answers.jsonl", "ckpt.pt", "config.json", "metrics.jsonl", "metrics.png", "passport.md",
                                      "samples.txt"]
    model = load_model(str(out))
    assert not any("lora" in k for k in model.state_dict())
    run = T.train(dict(TINY, **SFT_DATA, algo="sft", out_dir=str(tmp_path / "next"), init_from=str(out), max_iters=1))
    assert run.raw_model.config.n_embd == TINY["n_embd"]


def test_compile_flag_compiles_the_training_calls_only(tiny, monkeypatch):
    """--compile=True hands the model to torch.compile and trains through what it returns (here a
    stand-in that counts calls, since compiling takes minutes on a small CPU), while sampling and
    evaluation use the eager model; the losses are those of compile=False."""
    compiled = []

    class Counting(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model, self.calls = model, 0

        def forward(self, *args, **kwargs):
            self.calls += 1
            return self.model(*args, **kwargs)

    monkeypatch.setattr(torch, "compile", lambda model: compiled.append(Counting(model)) or compiled[-1])
    losses = {}
    for flag in (False, True):
        out_dir = f"{tiny['out_dir']}_{flag}"
        run = T.train(dict(tiny, **SFT_DATA, algo="sft", compile=flag, eval_interval=3, out_dir=out_dir))
        rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
        losses[flag] = [row["loss"] for row in rows if "loss" in row]
    assert len(compiled) == 1 and run.model is compiled[0] and compiled[0].model is run.raw_model
    assert compiled[0].calls == tiny["max_iters"]  # one training forward per step; evaluation's went to the eager model
    assert losses[True] == losses[False] and len(losses[True]) == tiny["max_iters"]


@pytest.mark.skipif(os.environ.get("TEST_TORCH_COMPILE") != "1",
                    reason="torch.compile itself takes minutes here (343 s for 3 tiny SFT steps on a loaded "
                           "2-core CPU): set TEST_TORCH_COMPILE=1 to run it")
def test_compiled_training_gives_the_eager_losses(tiny):
    losses = {}
    for flag in (False, True):
        out_dir = f"{tiny['out_dir']}_{flag}"
        T.train(dict(tiny, **SFT_DATA, algo="sft", compile=flag, out_dir=out_dir))
        rows = [json.loads(line) for line in open(os.path.join(out_dir, "metrics.jsonl"))]
        losses[flag] = [row["loss"] for row in rows if "loss" in row]
    assert losses[True] == pytest.approx(losses[False], rel=1e-4)


def test_lr_schedule_warmup_then_cosine():
    cfg = dict(options.DEFAULTS, max_iters=100, warmup_iters=10, learning_rate=1.0, min_lr=0.1)
    assert T.lr_at(cfg, 0) == pytest.approx(0.1) and T.lr_at(cfg, 9) == pytest.approx(1.0)
    assert T.lr_at(cfg, 55) == pytest.approx(0.55) and T.lr_at(cfg, 100) == pytest.approx(0.1)


# -- chat template and the SFT loss ---------------------------------------------------------------

def test_chat_template_mask_is_one_exactly_on_assistant_tokens():
    tok = Tokenizer()
    ids, mask = tok.render_chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"},
                                 {"role": "tool", "content": "42"}, {"role": "assistant", "content": "ok"}])
    s = tok.special
    assert ids == [tok.bos, s["user"], *b"hi", tok.eos, s["assistant"], *b"yo", tok.eos,
                   s["tool_result"], *b"42", s["/tool_result"], s["assistant"], *b"ok", tok.eos]
    learned = [i for i, m in zip(ids, mask) if m]
    assert learned == [*b"yo", tok.eos, *b"ok", tok.eos]
    assert tok.pad != tok.eos and tok.decode(tok.encode("<|eos|> é")) == "<|eos|> é"  # no special injection
    prompt = tok.prompt_ids("hi")
    assert prompt + tok.response_ids("yo") == ids[:len(prompt) + 3]
    for text in ("What is 7 + 8 - 3?", "", "<|user|> é\n"):  # prompt_ids writes render_chat's template itself
        assert tok.prompt_ids(text) == tok.render_chat([{"role": "user", "content": text}], add_generation_prompt=True)[0]


def test_sft_loss_ignores_prompt_and_padding():
    """The gradient reaches only logits at positions predicting a masked-in token, and extra padding
    changes neither the loss nor any parameter gradient."""
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(block_size=32, vocab_size=40, n_layer=1, n_head=2, n_embd=16))
    ids = torch.randint(0, 40, (2, 10))
    mask = torch.zeros(2, 10)
    mask[0, 6:] = 1
    mask[1, 4:8] = 1  # row 1: positions 8, 9 act as padding
    logits = model(ids[:, :-1])
    logits.retain_grad()
    logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    (-(logp * mask[:, 1:]).sum()).backward()
    touched = logits.grad.abs().sum(-1) > 0
    assert touched.tolist() == (mask[:, 1:] > 0).tolist()

    def grads(i, m):
        model.zero_grad()
        s, n = masked_nll(model, i, m)
        (s / n).backward()
        return s.item(), [p.grad.clone() for p in model.parameters()]

    loss_a, g_a = grads(ids, mask)
    padded = torch.cat([ids, torch.full((2, 5), 39)], 1)
    loss_b, g_b = grads(padded, torch.cat([mask, torch.zeros(2, 5)], 1))
    assert loss_a == pytest.approx(loss_b, abs=1e-5)
    for a, b in zip(g_a, g_b):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


# -- data files -------------------------------------------------------------------------------------

def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_sft_from_files_in_every_layout(tmp_path, tiny):
    rows = {
        "text": [{"text": "12+7=19."}] * 40,
        "pc": [{"prompt": "What is 1 + 2?", "completion": "Answer: 3"}] * 40,
        "messages": [{"messages": [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]}] * 40,
    }
    for name, layout in rows.items():
        data = _write_jsonl(tmp_path / f"{name}.jsonl", layout)
        run = T.train(dict(tiny, algo="sft", data=data, out_dir=str(tmp_path / name), max_iters=2))
        assert run.state.skipped_rows == 0 and len(run.state.train_examples) == 38
    run = T.train(dict(tiny, algo="pretrain", data=str(tmp_path / "text.jsonl"), out_dir=str(tmp_path / "pt"),
                       max_iters=2))
    assert len(run.state.stream) > 64


@pytest.mark.parametrize("bad,field,why", [
    ({"prompt": "q"}, "completion", "missing"),
    ({"prompt": 3, "completion": "a"}, "prompt", "expected str"),
    ({"prompt": "q", "completion": "  "}, "completion", "empty answer"),
    ({"prompt": "q", "completion": "x" * 500}, "completion", "longer than block_size"),
    ({"messages": [{"role": "user", "content": "q"}]}, "messages", "no non-empty assistant"),
    ({"messages": [{"role": "robot", "content": "q"}, {"role": "assistant", "content": "a"}]}, "messages", "role"),
    ({"question": "q"}, "text", "no known layout"),
])
def test_malformed_rows_name_file_row_and_field(tmp_path, tiny, bad, field, why):
    good = {"prompt": "What is 1 + 2?", "completion": "Answer: 3"}
    data = _write_jsonl(tmp_path / "d.jsonl", [good, good, bad, good])
    with pytest.raises(ValueError, match=rf"d\.jsonl: row 3: field '{field}'.*{why}"):
        T.train(dict(tiny, algo="sft", data=data))
    run = T.train(dict(tiny, algo="sft", data=data, skip_bad_rows=True, max_iters=1))
    assert run.state.skipped_rows == 1


def test_missing_data_file_is_a_clear_error(tiny):
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        T.train(dict(tiny, algo="sft", data="nope.jsonl"))


def test_an_unreachable_hub_dataset_is_one_line(tiny, monkeypatch):
    import datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'owner/name' on the Hub (LocalEntryNotFoundError)")
    monkeypatch.setattr(datasets, "load_dataset", offline)
    with pytest.raises(ValueError, match=r"^dataset 'owner/name': cannot load it \(Couldn't reach 'owner/name' on the "
                                         r"Hub \(LocalEntryNotFoundError\)\): check the name and that this machine "
                                         r"is online, or pass a local file$"):
        T.train(dict(tiny, **SFT_DATA, algo="sft", data="owner/name"))


def test_broken_json_line_names_its_line(tmp_path, tiny):
    good = json.dumps({"prompt": "What is 1 + 2?", "completion": "Answer: 3"})
    path = tmp_path / "d.jsonl"
    path.write_text("\n".join([good, good, '{"prompt": "q", "completion": ', good]) + "\n")
    with pytest.raises(ValueError, match=r"d\.jsonl: line 3: invalid JSON"):
        T.train(dict(tiny, algo="sft", data=str(path)))
    path.write_text("\n".join([good, "[1, 2]"]))
    with pytest.raises(ValueError, match=r"d\.jsonl: line 2: expected a JSON object, got list"):
        load_rows(str(path))
    array = tmp_path / "a.json"  # a .json file may also hold one array of rows
    array.write_text("[\n" + ",\n".join([good] * 3) + "\n]")
    assert load_rows(str(array)) == [json.loads(good)] * 3
    array.write_text("[\n" + good + ",\n" + '{"prompt": q},' + "\n" + good + "\n]")
    with pytest.raises(ValueError, match=r"a\.json: line 3: invalid JSON"):
        load_rows(str(array))


@pytest.mark.parametrize("text", ["", "\n  \n"])
def test_empty_data_file_says_it_is_empty(tmp_path, tiny, text):
    path = tmp_path / "empty.jsonl"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"empty\.jsonl: the file is empty"):
        T.train(dict(tiny, algo="sft", data=str(path)))


@pytest.mark.parametrize("algo,arg,suggestion", [
    ("sft", "--lr=3e-4", "learning_rate"), ("sft", "--bs=8", "batch_size"), ("sft", "--steps=10", "max_iters"),
    ("sft", "--wd=0.1", "weight_decay"), ("sft", "--clip=1.0", "grad_clip"), ("sft", "--seq_len=64", "block_size"),
    ("grpo", "--temp=0.7", "temperature"), ("ppo", "--epochs=2", "max_iters, inner_epochs"),
])
def test_unknown_keys_suggest_common_aliases(algo, arg, suggestion):
    key = arg[2:].split("=")[0]
    with pytest.raises(ValueError, match=rf"unknown config key '{key}' for --algo {algo}; did you mean {suggestion}"):
        options.make_config(options.parse_args([f"--algo={algo}", arg]))


def test_an_unknown_algo_lists_the_choices():
    with pytest.raises(ValueError, match=r"^unknown algo 'ghost'; choose from .*dpo, grpo, .*sft(, [a-z0-9_]+)*$"):
        options.make_config({"algo": "ghost"})  # (then the lab's variants)
    choices = options.available_algos()
    assert "ghost" not in choices and {"sft", "pretrain", "rm", "dpo", "grpo", "ppo"} <= set(choices)


def test_command_line_errors_are_one_line():
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "train.py", "--algo", "nope"], cwd=root, capture_output=True, text=True)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.startswith("error: unknown algo 'nope'; choose from dpo, grpo, ") and out.stderr.count("\n") == 1


# -- the command line: --help, the ladder's checkpoints, optional packages, logs ----------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_script(*args, cwd=ROOT, env=None):
    import subprocess
    import sys
    return subprocess.run([sys.executable, *args], cwd=cwd, capture_output=True, text=True, env=env)


def test_config_comments_read_the_line_then_the_lines_above_then_merged_dicts(tmp_path, monkeypatch):
    (tmp_path / "other_cfg.py").write_text("KEYS = dict(\n    merged=1,  # from the other file\n)\n")
    (tmp_path / "main_cfg.py").write_text(
        "import other_cfg\n"
        "defaults = dict(\n"
        "    a=1,            # a's own comment,\n"
        "                    # continued below it\n"
        "    # b's comment,\n"
        "    # on two lines\n"
        "    b=2,\n"
        "    c=3, d=4,       # shared by c and d\n"
        "    **other_cfg.KEYS,\n"
        ")\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import main_cfg
    assert usage.config_comments(main_cfg, "defaults") == {
        "merged": "from the other file", "a": "a's own comment, continued below it", "b": "b's comment, on two lines",
        "c": "shared by c and d", "d": "shared by c and d"}


@pytest.mark.parametrize("algo", options.available_algos())
def test_an_algorithm_changes_a_shared_default_only_to_a_value_of_its_type(algo):
    """An algorithm's (or variant's) defaults that change a shared key pass the type check a command
    line's value passes (options.coerce), so make_config need not check the source at every run."""
    module = options.algo_module(algo)
    changed = {key: value for key, value in module.defaults.items() if key in options.DEFAULTS}
    assert all(options.coerce(key, value, options.DEFAULTS[key]) == value for key, value in changed.items())
    cfg = options.make_config(dict(algo=algo))
    assert all(type(cfg[key]) is type(options.DEFAULTS[key]) for key in options.DEFAULTS), algo
    with pytest.raises(ValueError, match="expects float"):  # what the check says of a wrong one
        options.coerce("learning_rate", "fast", options.DEFAULTS["learning_rate"])


@pytest.mark.parametrize("algo", options.available_algos())
def test_help_describes_every_option_with_its_default(algo):
    """Every key the run can use is described with its value; the shared keys that cannot apply to it
    (usage.applies: a model's shape for a checkpoint start, --data for RL, another task's keys) are
    named in one line instead."""
    cfg = options.make_config(options.after_the_ladder(dict(algo=algo))[0])
    text = usage.help_text(dict(algo=algo))
    lines = {line.split("=", 1)[0].strip(): line for line in text.splitlines() if line.startswith("  --")}
    left = {key for key in options.DEFAULTS if not usage.applies(key, cfg, options.algo_module(algo))}
    assert set(lines) == {f"--{key}" for key in cfg if key not in left}
    if left:
        named = text.splitlines()[-1].split(": ", 1)[1].split(", ")
        assert sorted(named) == sorted(f"--{key}" for key in left)
    for key, value in cfg.items():
        if key in left:
            continue
        shown, description = lines[f"--{key}"].split(None, 1)[0], lines[f"--{key}"][40:].strip()
        needs = getattr(options.algo_module(algo), "starts_from", {}).get(key)
        if needs and value == "scratch":  # (a start the algorithm refuses is not shown as its value)
            assert shown == f"--{key}=REQUIRED" and description.endswith(f"e.g. out/{needs})"), key
            continue
        assert shown.rstrip("*") == f"--{key}={value!r}" and description, key


def test_help_on_the_command_line():
    out = run_script("train.py", "--algo", "grpo", "--help")
    assert out.returncode == 0 and out.stderr == ""
    assert "--kl_coef=0.04" in out.stdout and "--learning_rate=0.0001*" in out.stdout and "usage: python train.py" in out.stdout
    out = run_script("export.py", "--help")
    assert out.returncode == 0 and out.stdout.startswith("usage: python export.py CKPT_DIR")


def help_lines(overrides):
    """{key: its --help line's description}, and the keys in the order --help prints them."""
    lines = [line for line in usage.help_text(overrides).splitlines() if line.startswith("  --")]
    return {line.split("=", 1)[0].strip()[2:]: line[40:].strip() for line in lines}, [line.split("=", 1)[0][4:] for line in lines]


@pytest.mark.parametrize("algo", options.available_algos())
def test_help_prints_whole_descriptions_and_the_algorithms_own_options_first(algo):
    described, order = help_lines(dict(algo=algo))
    own = [key for key in order if key not in options.DEFAULTS]
    loop = [key for key in options.DEFAULTS if key in order and key not in usage.TASK_KEYS]
    assert order == own + loop + [key for key in options.DEFAULTS if key in order and key in usage.TASK_KEYS]
    assert not any("see above" in text or "see the docstring" in text for text in described.values())
    if algo == "grpo":  # descriptions that run over two comment lines come whole
        assert described["group_size"].endswith("still has a correct and a wrong answer in most groups")
        assert described["minibatches"].endswith("more reuse each rollout batch, off-policy")
        assert described["eval_samples"].endswith("0 = greedy only")
    if algo == "ppo":  # keys that once shared a line have their own descriptions
        assert described["gamma"] != described["lam"] and "λ" in described["lam"]


def test_help_shows_the_defaults_after_the_ladder(tmp_path, monkeypatch):
    """Once the ladder has run, --help shows what a run would take: its checkpoint, and out/my_ALGO."""
    for name in ("sft", "grpo"):
        os.makedirs(tmp_path / "out" / name)
        for file in ("ckpt.pt", "ladder.json"):
            (tmp_path / "out" / name / file).write_text("{}")
        (tmp_path / "out" / name / "config.json").write_text(json.dumps(dict(algo=name, env="arithmetic")))
    monkeypatch.chdir(tmp_path)
    text = usage.help_text(dict(algo="grpo"))
    assert "--init_from='out/sft'*" in text and "--out_dir='out/my_grpo'" in text
    assert "grpo: --init_from=out/sft (the ladder's sft stage)" in text
    assert "--init_from='x'*" in usage.help_text(dict(algo="grpo", init_from="x"))


def test_after_the_ladder_a_run_starts_from_its_stages_and_writes_elsewhere(tmp_path, monkeypatch):
    """With no --init_from / --teacher / --out_dir: the ladder's checkpoint for the task, its grpo stage
    as OPD's teacher, and out/my_ALGO instead of a ladder stage; what is given is kept."""
    for name, algo, env in (("sft", "sft", "arithmetic"), ("calc_sft", "sft", "calculator"),
                            ("grpo", "grpo", "arithmetic"), ("dpo", "dpo", "arithmetic"), ("my_sft", "sft", "arithmetic")):
        os.makedirs(tmp_path / "out" / name)
        for file in ("ckpt.pt", "ladder.json") if name != "my_sft" else ("ckpt.pt",):
            (tmp_path / "out" / name / file).write_text("{}")
        (tmp_path / "out" / name / "config.json").write_text(json.dumps(dict(algo=algo, env=env)))
    monkeypatch.chdir(tmp_path)
    overrides, line = options.after_the_ladder(dict(algo="dpo"))
    assert overrides == dict(algo="dpo", init_from="out/sft", out_dir="out/my_dpo")
    assert line == ("dpo: --init_from=out/sft (the ladder's sft stage), --out_dir=out/my_dpo (out/dpo is a ladder "
                    "stage); pass these keys to choose others")
    assert options.after_the_ladder(dict(algo="grpo", env="calculator"))[0]["init_from"] == "out/calc_sft"
    assert options.after_the_ladder(dict(algo="opd"))[0] == dict(algo="opd", init_from="out/sft", teacher="out/grpo")
    assert options.after_the_ladder(dict(algo="dpo", init_from="x", out_dir="y")) == (dict(algo="dpo", init_from="x", out_dir="y"), "")
    assert options.after_the_ladder(dict(algo="dpo", init_from="resume"))[0] == dict(algo="dpo", init_from="resume", out_dir="out/my_dpo")
    assert options.after_the_ladder(dict(algo="sft"))[0] == dict(algo="sft", out_dir="out/my_sft")  # from scratch, as always
    assert options.after_the_ladder(dict(algo="ppo", env="generalpoints")) == (dict(algo="ppo", env="generalpoints"), "")


def test_a_missing_optional_package_is_one_line(tmp_path, tiny):
    """export.py and GPT-2 weights without transformers: the install command in one line, no traceback."""
    T.train(dict(tiny, max_iters=1))
    blocked = "import sys; sys.modules['transformers'] = None; import runpy; sys.argv = sys.argv[1:]; " \
              "runpy.run_path(sys.argv[0], run_name='__main__')"
    out = run_script("-c", blocked, "export.py", tiny["out_dir"], str(tmp_path / "hf"))
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert out.stderr == "error: this needs the optional package transformers: pip install -r requirements-extra.txt\n"
    out = run_script("-c", blocked, "train.py", "--init_from=gpt2", f"--out_dir={tmp_path / 'gpt2'}")
    assert out.returncode == 1 and out.stderr.startswith("error: ") and "pip install" in out.stderr
    assert out.stderr.count("\n") == 1, out.stderr


def test_progress_bar_does_not_flood_a_log(tiny, capsys):
    """Into a pipe or a file (pytest's capture) the bar redraws every 30 s, not 10 times a second."""
    T.train(dict(tiny, max_iters=40, log_interval=10))
    assert capsys.readouterr().err.count("\r") <= 3


def test_old_key_names_work_for_one_release_and_say_the_new_one(tmp_path, tiny, capsys):
    """One name per idea: responses per prompt is group_size (was samples_per_prompt, candidates), a
    pool of train prompts is prompt_pool (was prompts_pool). The old names still work, each with a
    one-line note: on the command line, in a ladder stage's keys and in a resumed run's saved config."""
    cfg = options.make_config(dict(algo="ppo", prompts_pool=64, samples_per_prompt=2))
    assert (cfg["prompt_pool"], cfg["group_size"]) == (64, 2) and "prompts_pool" not in cfg
    assert options.make_config(dict(algo="rft", candidates=5))["group_size"] == 5
    out = capsys.readouterr().out
    assert "note: config key 'prompts_pool' is now 'prompt_pool'" in out and "'candidates' is now 'group_size'" in out
    import ladder
    _, wide, per_stage = ladder.parse_command_line(["--ppo.prompts_pool=64", "--samples_per_prompt=2"])
    assert per_stage["ppo"] == dict(prompt_pool=64) and wide == dict(group_size=2)
    # a checkpoint whose saved config has the old names resumes, under the new ones
    T.train(dict(tiny, algo="ppo", prompt_pool=16, batch_size=4, minibatches=1, max_new_tokens=8, max_iters=1))
    path = os.path.join(tiny["out_dir"], "ckpt.pt")
    ckpt = torch.load(path, weights_only=True)
    ckpt["config"]["prompts_pool"] = ckpt["config"].pop("prompt_pool")
    torch.save(dict(ckpt, checksum=checksum(ckpt)), path)  # (as that older version wrote it: its checksum matches)
    resumed = T.train(dict(algo="ppo", init_from="resume", out_dir=tiny["out_dir"], max_iters=2))
    assert resumed.cfg["prompt_pool"] == 16 and "'prompts_pool' is now 'prompt_pool'" in capsys.readouterr().out


def test_a_checkpoint_of_an_earlier_version_resumes_in_this_versions_spelling(capsys):
    """An earlier version's saved config: its old option that is now a variant of the lab resumes as that
    variant, a renamed key under its new name, and a key no option takes any more is dropped with a note."""
    import grpo
    old = dict(options.DEFAULTS, **grpo.defaults, algo="grpo", estimator="rloo", ppo_epochs=2, simpo_beta=2.0)
    config = resume.saved_config(dict(config=old), "out/old")
    assert config["algo"] == "rloo" and "estimator" not in config and "simpo_beta" not in config
    assert config["inner_epochs"] == 2 and options.make_config(config)["algo"] == "rloo"
    assert "out/old/ckpt.pt was written by an earlier version: its config keys simpo_beta are no option of --algo rloo" \
        in capsys.readouterr().out


def test_a_spelling_two_algorithms_shared_switches_to_the_variant_of_the_algorithm_given(capsys):
    """--reward_mode was grpo's and ppo's: each old value is now a variant of each (options.MOVED_TO_LAB)."""
    assert options.renamed(dict(algo="ppo", reward_mode="rlvp")) == dict(algo="ppo_rlvp")
    assert options.renamed(dict(algo="grpo", reward_mode="rlvp")) == dict(algo="rlvp")
    assert options.renamed(dict(algo="grpo", reward_mode="process")) == dict(algo="process_reward")
    assert options.renamed(dict(algo="ppo", reward_mode="outcome")) == dict(algo="ppo")  # the plain one: dropped
    assert "--reward_mode='rlvp' is now --algo ppo_rlvp" in capsys.readouterr().out


def test_a_variants_help_lists_what_it_sets_otherwise_among_its_own_options():
    """--algo opsd's teacher ('self') is opsd's own default, so it is listed with opsd's options, not opd's."""
    text = usage.help_text(dict(algo="opsd"))
    own, base = text.split("opd's options", 1)
    assert "--teacher='self'" in own and "--teacher=" not in base
