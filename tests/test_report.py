"""report.py and the token records behind it (nanopost/token_records.py): which iterations a run keeps,
that the records hold what the iteration computed, and the page in a real browser (headless Chromium:
no console error, one coloured span per saved token, the switch recolours them, a screenshot that is
not blank and shows the figure). The browser tests are skipped where Chromium is not installed (CI
installs it: .ci/run)."""

import base64
import gzip
import json
import re
import os
import shutil
import subprocess

import pytest
import torch

import report
import train as T
from grpo import group_advantages
from nanopost.options import make_config
from nanopost.token_records import kept

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH: the browser checks need it "
                                    "(apt-get install -y chromium; CI installs it in .ci/run)")
SMALL = dict(algo="grpo", prompts_per_iter=4, group_size=4, max_new_tokens=16, checkpoint=False, init_from="scratch")


@pytest.fixture(scope="module")
def grpo_run(tmp_path_factory):
    """A tiny GRPO run of 3 iterations that keeps 2 (iterations 0 and 1), evaluated at 0 and 3, and its report."""
    from conftest import TINY
    out = str(tmp_path_factory.mktemp("report") / "grpo")
    T.train(dict(TINY, **SMALL, max_iters=3, eval_interval=3, keep_tokens=2, out_dir=out))
    report.write_report(out)
    return out


def records(out):
    return [json.loads(line) for line in open(os.path.join(out, "tokens.jsonl"))]


def test_the_kept_iterations_spread_from_the_first_to_the_last_but_one():
    def kept_of(n, max_iters):
        cfg = dict(keep_tokens=n, max_iters=max_iters)
        return [it for it in range(max_iters) if kept(cfg, it)]
    assert kept_of(0, 10) == []
    assert kept_of(1, 10) == [0] and kept_of(4, 1) == []  # (one iteration: no next one to score its update)
    assert kept_of(3, 10) == [0, 4, 8]
    assert kept_of(4, 20) == [0, 6, 12, 18]
    assert kept_of(50, 5) == [0, 1, 2, 3]  # more than the run has: every iteration with a next one
    with pytest.raises(ValueError, match="keep_tokens"):
        make_config(dict(algo="grpo", keep_tokens=-1))


def test_the_records_hold_each_response_token_and_the_iterations_advantages(grpo_run):
    lines = records(grpo_run)
    assert [(r["iter"], r["kind"]) for r in lines] == [(0, "rollouts"), (0, "after"), (1, "rollouts"), (1, "after")]
    for rollouts, after in ((lines[0], lines[1]), (lines[2], lines[3])):
        rows = rollouts["rows"]
        assert len(rows) == SMALL["prompts_per_iter"] * SMALL["group_size"]
        for row, logp_after in zip(rows, after["after"]):
            n = len(row["tokens"])
            assert 1 <= n <= SMALL["max_new_tokens"]
            assert len(row["logp_old"]) == len(row["entropy"]) == len(row["tool"]) == len(logp_after) == n
            assert all(0 <= h <= torch.log(torch.tensor(512.0)) + 1e-3 for h in row["entropy"])
            assert all(lp <= 0 for lp in row["logp_old"] + logp_after)
        # the recorded advantage is GRPO's group z-score of the recorded verdicts
        verdicts = torch.tensor([row["verdict"] for row in rows])
        expected = group_advantages(verdicts, SMALL["group_size"])
        assert torch.allclose(torch.tensor([row["advantage"] for row in rows]), expected, atol=1e-4)


def test_the_held_out_answers_are_saved_at_each_evaluation(grpo_run):
    lines = [json.loads(line) for line in open(os.path.join(grpo_run, "answers.jsonl"))]
    assert [line["iter"] for line in lines] == [0, 3]
    assert [a["prompt"] for a in lines[0]["answers"]] == [a["prompt"] for a in lines[1]["answers"]]
    assert all(a["verdict"] in (0.0, 1.0) for line in lines for a in line["answers"])
    (label_a, _), (label_b, _) = report.before_and_after(grpo_run, {})
    assert (label_a, label_b) == ("iteration 0", "iteration 3")


def test_a_directory_without_a_run_is_one_line_naming_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="no config.json"):
        report.write_report(str(tmp_path))


def chromium(url, *flags):
    """Headless Chromium on `url`: (the DOM after the page's script ran, the console lines)."""
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=5000",
                           "--enable-logging=stderr", "--v=0", *flags, url], capture_output=True, text=True, timeout=120)
    return done.stdout, [line for line in done.stderr.splitlines() if "CONSOLE" in line]


def span_colours(dom):
    """The background colour of every coloured token span, in order."""
    return re.findall(r'<span class="tok[ a-z]*"[^>]*style="background-color: ([^;"]*)', dom)


@needs_chromium
def test_the_page_renders_one_coloured_span_per_saved_token_and_the_switch_recolours_them(grpo_run):
    url = "file://" + os.path.join(grpo_run, "report.html")
    dom, console = chromium(url + "#colour=advantage", "--dump-dom")
    assert console == []  # no error, no warning: the script logs nothing of its own
    saved = sum(len(row["tokens"]) for row in records(grpo_run)[0]["rows"])  # the first kept iteration, shown first
    advantage = span_colours(dom)
    assert len(advantage) == saved
    entropy = span_colours(chromium(url + "#colour=entropy", "--dump-dom")[0])
    assert len(entropy) == saved and entropy != advantage
    assert "<svg" in dom and "Before and after" in dom


@needs_chromium
def test_a_screenshot_is_not_blank_and_shows_the_figure(grpo_run, tmp_path):
    import matplotlib.image
    shot = str(tmp_path / "shot.png")
    chromium("file://" + os.path.join(grpo_run, "report.html"), f"--screenshot={shot}", "--window-size=1200,1000")
    pixels = matplotlib.image.imread(shot)[..., :3]  # (H, W, 3) in [0, 1]
    assert pixels.shape[0] >= 900 and pixels.std() > 0.05  # not one colour
    # matplotlib's first line colour, C0 = #1f77b4, drawn in the figure near the top of the page
    c0 = torch.tensor([0x1F, 0x77, 0xB4]) / 255.0
    near = (torch.tensor(pixels) - c0).abs().amax(-1) < 0.08
    assert near.sum() > 50


def worked_run(directory):
    """A run directory written by hand: two answers of one group, a tool's two tokens in the second,
    ρ after the update chosen so that one token of each answer leaves the clip range on the side its
    advantage cuts (ρ = e^0.5 > 1 + ε with A = +1; ρ = e^−0.5 < 1 − ε with A = −1), and an alarm."""
    os.makedirs(directory)
    json.dump(dict(algo="grpo", clip_eps=0.2, init_from="scratch"), open(os.path.join(directory, "config.json"), "w"))
    with open(os.path.join(directory, "metrics.jsonl"), "w") as f:
        f.write(json.dumps(dict(iter=1, reward=0.5, entropy=1.0)) + "\n")
        f.write(json.dumps(dict(iter=2, reward=0.0, entropy=0.5, alarms=["entropy_collapse"])) + "\n")
    row = dict(prompt="What is 1 + 1?", group=[0, 0], parsed=True, logp_old=[-1.0, -1.0, -1.0])
    rows = [dict(row, tokens=["Answer", ": ", "2"], tool=[0, 0, 0], verdict=1.0, advantage=1.0),
            dict(row, tokens=["<call>", "1+1", "=2"], tool=[0, 1, 1], verdict=0.0, advantage=-1.0)]
    with open(os.path.join(directory, "tokens.jsonl"), "w") as f:
        f.write(json.dumps(dict(iter=0, kind="rollouts", rows=rows)) + "\n")
        f.write(json.dumps(dict(iter=0, kind="after", after=[[-0.5, -1.0, -1.0], [-1.5, -1.0, -1.0]])) + "\n")
    return report.write_report(directory)


def test_the_report_lists_the_alarms_and_reads_the_records_back(tmp_path):
    page = open(worked_run(str(tmp_path / "run"))).read()
    assert "entropy_collapse</b> at iteration 2" in page
    data = json.loads(page.split("id='data'>")[1].split("</script>")[0])
    record = json.loads(gzip.decompress(base64.b64decode(data["packed"][0])))
    assert data["iterations"] == [0] and record["rows"][1]["logp_after"] == [-1.5, -1.0, -1.0]  # "after" merged in


@needs_chromium
def test_the_ratio_view_outlines_the_clipped_tokens_and_hatches_the_tools(tmp_path):
    url = "file://" + worked_run(str(tmp_path / "run"))
    dom, console = chromium(url + "#colour=ratio", "--dump-dom")
    assert console == []
    spans = re.findall(r'<span class="(tok(?: [a-z]+)*)"', dom)
    assert spans == ["tok clipped", "tok", "tok", "tok clipped", "tok tool", "tok tool"]
    colours = span_colours(chromium(url + "#colour=advantage", "--dump-dom")[0])
    assert colours[:4] == ["rgba(30, 160, 60, 0.85)"] * 3 + ["rgba(215, 40, 40, 0.85)"]  # A = +1, then −1: full strength


@pytest.mark.parametrize("algo", ["kl_reward", "one_step_off", "vector_reward", "maxrl", "reinforce", "reinforce_pp",
                                  "edge_prompts", "truncated_sampling"])
def test_a_variant_with_its_own_iteration_keeps_its_tokens_too(algo, tmp_path):
    """A variant of the lab that writes its own batches keeps the same records as grpo.py's."""
    from conftest import TINY
    out = str(tmp_path / algo)
    T.train(dict(TINY, **dict(SMALL, algo=algo), max_iters=3, keep_tokens=2, out_dir=out))
    kinds = [(r["iter"], r["kind"]) for r in records(out)]
    assert [k for k in kinds if k[1] == "rollouts"] == [(0, "rollouts"), (1, "rollouts")], kinds
    assert all(len(row["tokens"]) == len(row["logp_old"]) for r in records(out) if r["kind"] == "rollouts" for row in r["rows"])
