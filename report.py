"""
The report of a run, in the browser: one self-contained HTML file (no server, no network: open it by
double-click), written from the files the run left in its directory.

    python report.py out/grpo          # out/grpo/report.html: one run
    python report.py out               # out/report.html: a ladder's stages side by side (ladder.py writes it)

A run's report holds
  - its curves over the iterations (reward, accuracy, KL, entropy, clip fraction, length, ...), each
    monitor's alarm a red line where it fired (metrics.jsonl), as inline SVG drawn by matplotlib;
  - its passport (passport.md) and its configuration (config.json);
  - the samples, token by token, of the iterations the run kept (tokens.jsonl, keep_tokens=N:
    nanopost/token_records.py): each prompt's group of answers, every response token coloured by the
    quantity a switch chooses (the advantage, ρ = π_new/π_old after the iteration's update with the
    tokens whose gradient the clip cut outlined, the log-ratio to π_ref as k1 or k3, the entropy, the
    teacher's log-ratio (OPD, OPSD), the step rewards (process rewards, RLVP), the critic's values
    (PPO)); the verdict and whether the answer parsed beside each; a tool's tokens hatched grey (no
    loss trains on them); hovering a token shows its numbers. DPO: each pair's chosen and rejected
    answers side by side, coloured by the implicit reward β·(log π_θ − log π_ref) of each token;
  - before and after: the held-out problems answered greedily at the run's first evaluation (or by the
    run it started from) and at its last (answers.jsonl), the answers whose verdict changed marked.
The page's script is plain JavaScript; `#colour=NAME` in the address chooses the colouring at load.
"""

import base64
import gzip
import html
import io
import json
import os
import sys

from nanopost.evaluation import read_metrics

# the curves a learner looks for first: (panel title, the metrics.jsonl keys drawn in it)
CURVES = [
    ("reward and accuracy on the training samples", ("reward", "verifier_acc", "pref_acc", "pair_acc")),
    ("held-out accuracy", ("heldout_acc", "heldout_sampled_acc", "ood_acc", "heldout_pass@8", "val_pref_acc")),
    ("loss", ("loss", "val_loss", "policy_loss", "value_loss")),
    ("KL", ("kl_ref", "kl_k3", "heldout_kl_ref", "approx_kl", "reverse_kl", "anchor_kl")),
    ("entropy (nats per token)", ("entropy",)),
    ("clip fraction and |ρ − 1|", ("clip_frac", "ratio_dev")),
    ("length (tokens)", ("len_mean", "heldout_len", "len_chosen", "len_rejected")),
    ("implicit rewards (DPO)", ("reward_chosen", "reward_rejected", "margin")),
    ("share of answers that show their work", ("work_frac", "heldout_work")),
]


def read_jsonl(path):
    """The lines of a JSON-lines file, [] when there is none."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def read_text(path):
    return open(path).read() if os.path.exists(path) else ""


def token_records(run_dir):
    """tokens.jsonl as {iteration: record}, the last line of each iteration winning (a resumed run
    appends), and each kept rollout's ρ after its update merged into its rows (logp_after)."""
    records, after = {}, {}
    for line in read_jsonl(os.path.join(run_dir, "tokens.jsonl")):
        if line["kind"] == "after":
            after[line["iter"]] = line["after"]
        else:
            records[line["iter"]] = line
    for it, record in records.items():
        for row, logp in zip(record.get("rows", []), after.get(it, [])):
            row["logp_after"] = logp
        for row in record.get("rows", []):
            for key in ("ids", "start", "text"):  # (for the rescoring and a reader of the file: the page shows the tokens)
                row.pop(key, None)
            if not any(row.get("tool", ())):
                row.pop("tool", None)  # (no tool token: a smaller page)
        for pair in record.get("pairs", []):
            for side in (pair["chosen"], pair["rejected"]):
                side.pop("ids", None)
    return [records[it] for it in sorted(records)]


def evaluations(run_dir):
    """answers.jsonl as [(iteration, answers)], in order, the last line of each iteration winning."""
    found = {line["iter"]: line["answers"] for line in read_jsonl(os.path.join(run_dir, "answers.jsonl"))}
    return sorted(found.items())


def before_and_after(run_dir, config):
    """(label, answers) at the start and at the end: the run's first and last evaluations, or, with one,
    the last evaluation of the run it started from (init_from) as the start. None without two."""
    found = evaluations(run_dir)
    start = config.get("init_from", "")
    if len(found) == 1 and start and os.path.isdir(start) and evaluations(start):
        it, answers = evaluations(start)[-1]
        found = [(f"{start} (iteration {it})", answers)] + [(f"iteration {i}", a) for i, a in found]
    else:
        found = [(f"iteration {i}", a) for i, a in found]
    return (found[0], found[-1]) if len(found) >= 2 else None


# ----------------------------------------------------------------------------------------------
# The figures

def curves_svg(rows):
    """The run's curves as one inline SVG: a panel per CURVES entry that has data, the alarms red."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    plt.rcParams["svg.fonttype"] = "none"  # text stays text: a smaller file
    panels = [(title, [k for k in keys if any(isinstance(r.get(k), (int, float)) for r in rows)])
              for title, keys in CURVES]
    panels = [(title, keys) for title, keys in panels if keys]
    if not panels:
        return "<p>No curves: metrics.jsonl holds no figure this report draws.</p>"
    alarms = alarm_rows(rows)
    ncol = min(3, len(panels))
    nrow = -(-len(panels) // ncol)
    fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 2.7 * nrow), squeeze=False)
    for ax, (title, keys) in zip(axes.flat, panels):
        for key in keys:
            points = [(r["iter"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            ax.plot(*zip(*points), marker="." if len(points) < 30 else None, label=key)
        for it in sorted(alarms):
            ax.axvline(it, color="red", lw=0.8, ls="--")
        ax.set_title(title, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.set_xlabel("iteration", fontsize=7)
        ax.legend(fontsize=6, frameon=False)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    fig.tight_layout()
    out = io.StringIO()
    fig.savefig(out, format="svg")
    plt.close(fig)
    svg = out.getvalue()
    return svg[svg.index("<svg"):]


def alarm_rows(rows):
    """{iteration: the alarms holding there} from metrics.jsonl's `alarms` flags."""
    return {r["iter"]: r["alarms"] for r in rows if r.get("alarms")}


def alarm_list(rows):
    """Each alarm with the iterations where it held, as HTML."""
    held = {}
    for it, names in sorted(alarm_rows(rows).items()):
        for name in names:
            held.setdefault(name, []).append(it)
    if not held:
        return "<p>No monitor fired.</p>"
    return "<ul>" + "".join(f"<li><b class='bad'>{html.escape(name)}</b> at iteration {its[0]}"
                            + (f" (and {len(its) - 1} later)" if len(its) > 1 else "") + "</li>"
                            for name, its in held.items()) + "</ul>"


# ----------------------------------------------------------------------------------------------
# Before and after

def verdict_cell(answer):
    ok = answer["verdict"] > 0
    return (f"<td class='{'good' if ok else 'bad'}'>{'✓' if ok else '✗'} "
            f"<code>{html.escape(answer['response'])}</code></td>")


def before_after_table(pair):
    """The held-out answers at the start and at the end, side by side; the verdicts that changed first."""
    if pair is None:
        return "<p>Needs two evaluations (answers.jsonl): this run has fewer, and so has the run it started from.</p>"
    (label_a, before), (label_b, after) = pair
    by_prompt = {a["prompt"]: a for a in before}
    rows = [(by_prompt[a["prompt"]], a) for a in after if a["prompt"] in by_prompt]
    fixed = sum(a["verdict"] > b["verdict"] for b, a in rows)
    broken = sum(a["verdict"] < b["verdict"] for b, a in rows)
    rows.sort(key=lambda ba: ba[0]["verdict"] == ba[1]["verdict"])
    body = "".join(f"<tr class='{changed(b, a)}'><td>{html.escape(b['prompt'])}</td><td>{html.escape(str(b.get('answer')))}</td>"
                   f"{verdict_cell(b)}{verdict_cell(a)}</tr>" for b, a in rows)
    return (f"<p>{len(rows)} held-out problems, greedy answers: right at the start {sum(b['verdict'] > 0 for b, _ in rows)}, "
            f"at the end {sum(a['verdict'] > 0 for _, a in rows)}; <span class='good'>{fixed} turned right</span>, "
            f"<span class='bad'>{broken} turned wrong</span> (listed first).</p>"
            f"<table class='answers'><tr><th>problem</th><th>answer</th><th>{html.escape(label_a)}</th>"
            f"<th>{html.escape(label_b)}</th></tr>{body}</table>")


def changed(before, after):
    return "fixed" if after["verdict"] > before["verdict"] else "broken" if after["verdict"] < before["verdict"] else ""


# ----------------------------------------------------------------------------------------------
# The page

STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1em 2em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 1.5em; border-bottom: 1px solid #ccc; }
pre.passport { white-space: pre-wrap; background: #f6f6f6; padding: .8em; max-height: 30em; overflow: auto; }
.good { color: #17732f; } .bad { color: #b3261e; }
table.answers { border-collapse: collapse; } table.answers td, table.answers th { border: 1px solid #ddd; padding: 2px 6px; vertical-align: top; }
tr.fixed { background: #e3f6e6; } tr.broken { background: #fbe3e1; }
#controls { position: sticky; top: 0; background: #fff; padding: .4em 0; border-bottom: 1px solid #ddd; z-index: 1; }
.group { margin: .6em 0 1em; } .prompt { color: #555; font-style: italic; }
.answer { display: flex; gap: .6em; margin: 2px 0; align-items: baseline; }
.meta { flex: 0 0 17em; font-size: 12px; font-family: monospace; white-space: nowrap; }
.tokens { font-family: monospace; white-space: pre-wrap; word-break: break-all; min-width: 0; }
.tok { border-radius: 2px; } .tok.clipped { outline: 2px solid #b3261e; }
.tok.tool { background: repeating-linear-gradient(45deg, #ddd, #ddd 3px, #f4f4f4 3px, #f4f4f4 6px) !important; color: #666; }
.pairs { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
#tip { position: fixed; display: none; background: #222; color: #fff; font: 12px monospace; padding: 4px 6px;
       border-radius: 3px; pointer-events: none; white-space: pre; z-index: 2; }
.legend span { display: inline-block; width: 3em; height: 1em; vertical-align: middle; }
"""

QUANTITIES = """
// colouring quantities: name -> [label, signed?, function(row, t) giving the value at response token t or null]
const EPS = DATA.clip_eps;
function adv(row, t) { return row.advantage == null ? null : (Array.isArray(row.advantage) ? row.advantage[t] : row.advantage); }
const QUANTITIES = {
  advantage: ["advantage A (the weight of the token's log-prob in the gradient)", true, adv],
  ratio: ["log ρ = log π_new/π_old after the update (outlined: the clip cut the gradient)", true,
          (row, t) => row.logp_after ? row.logp_after[t] - row.logp_old[t] : null],
  k1: ["k1 = log π_old − log π_ref (the log-ratio to the reference)", true,
       (row, t) => row.logp_ref && row.logp_old ? row.logp_old[t] - row.logp_ref[t] : null],
  k3: ["k3 = π_ref/π_old − log(π_ref/π_old) − 1 (≥ 0)", false,
       (row, t) => { if (!row.logp_ref || !row.logp_old) return null; const d = row.logp_ref[t] - row.logp_old[t]; return Math.exp(d) - d - 1; }],
  entropy: ["entropy of the policy at the token (nats)", false, (row, t) => row.entropy ? row.entropy[t] : null],
  teacher: ["log π_teacher − log π_student (the teacher's log-ratio)", true,
            (row, t) => row.logp_teacher ? row.logp_teacher[t] - row.logp_old[t] : null],
  step_reward: ["step reward (process, RLVP): on the token that closes a step", true,
                (row, t) => row.step_reward ? row.step_reward[t] : null],
  value: ["the critic's value V(s_t) (PPO)", true, (row, t) => row.value ? row.value[t] : null],
  value_target: ["the critic's target R_t = Â_t + V_t (PPO, GAE)", true, (row, t) => row.value_target ? row.value_target[t] : null],
  surprise: ["−log π_old: how unlikely the sampled token was", false, (row, t) => row.logp_old ? -row.logp_old[t] : null],
  implicit: ["implicit reward per token β·(log π_θ − log π_ref) (DPO)", true,
             (row, t) => row.logp && row.logp_ref && DATA.beta_of[row.iter] != null ? DATA.beta_of[row.iter] * (row.logp[t] - row.logp_ref[t]) : null],
  logp_pair: ["log π_θ − log π_ref per token", true, (row, t) => row.logp && row.logp_ref ? row.logp[t] - row.logp_ref[t] : null],
};
"""

SCRIPT = """
const DATA = JSON.parse(document.getElementById("data").textContent);
%QUANTITIES%
const tip = document.getElementById("tip");
let colour = null, shown = 0;

function clipped(row, t) {
  const a = adv(row, t);
  if (!row.logp_after || a == null) return false;
  const r = Math.exp(row.logp_after[t] - row.logp_old[t]);
  return (a > 0 && r > 1 + EPS) || (a < 0 && r < 1 - EPS);
}
function rowsOf(record) {
  if (record.kind === "pairs") return record.pairs.flatMap(p => [p.chosen, p.rejected]);
  return record.rows;
}
function available(record) {
  const rows = rowsOf(record);
  return Object.keys(QUANTITIES).filter(q => rows.some(row => row.tokens.some((_, t) => { const v = QUANTITIES[q][2](row, t); return v != null && isFinite(v); })));
}
function scaleOf(record, q) {
  let m = 1e-9;
  for (const row of rowsOf(record)) row.tokens.forEach((_, t) => { if (!row.tool || !row.tool[t]) { const v = QUANTITIES[q][2](row, t); if (v != null && isFinite(v)) m = Math.max(m, Math.abs(v)); } });
  return m;
}
function paint(v, m, signed) {
  if (v == null || !isFinite(v)) return "transparent";
  const a = Math.min(1, Math.abs(v) / m) * 0.85;
  if (!signed) return `rgba(120, 60, 200, ${a.toFixed(3)})`;
  return v >= 0 ? `rgba(30, 160, 60, ${a.toFixed(3)})` : `rgba(215, 40, 40, ${a.toFixed(3)})`;
}
function numbers(row, t) {
  const lines = [`token ${JSON.stringify(row.tokens[t])}`];
  if (row.tool && row.tool[t]) lines.push("written by the tool: masked, no loss trains on it");
  for (const q of Object.keys(QUANTITIES)) { const v = QUANTITIES[q][2](row, t); if (v != null && isFinite(v)) lines.push(`${q}: ${v.toFixed(4)}`); }
  if (row.logp_after && row.logp_old) lines.push(`ρ: ${Math.exp(row.logp_after[t] - row.logp_old[t]).toFixed(4)}${clipped(row, t) ? " (clipped)" : ""}`);
  return lines.join("\\n");
}
function tokensOf(row, q, m) {
  const box = document.createElement("span"); box.className = "tokens";
  const [, signed, f] = QUANTITIES[q] || [null, true, () => null];
  row.tokens.forEach((text, t) => {
    const s = document.createElement("span");
    s.className = "tok" + (row.tool && row.tool[t] ? " tool" : "") + (q === "ratio" && clipped(row, t) ? " clipped" : "");
    s.textContent = text.replace(/\\n/g, "⏎\\n");
    s.style.backgroundColor = paint(f(row, t), m, signed);
    s.dataset.t = t; s.row = row;
    box.appendChild(s);
  });
  return box;
}
function meta(row) {
  const parts = [row.verdict > 0 ? "<b class='good'>✓ right</b>" : "<b class='bad'>✗ wrong</b>"];
  if (row.parsed != null) parts.push(row.parsed ? "parsed" : "<span class='bad'>parse error</span>");
  const a = row.advantage; if (a != null && !Array.isArray(a)) parts.push(`A ${a.toFixed(2)}`);
  const d = document.createElement("div"); d.className = "meta"; d.innerHTML = parts.join(" · "); return d;
}
async function unpack(i) {
  // one kept iteration, gzipped JSON in base64: only the iteration shown is unpacked and parsed
  const bytes = Uint8Array.from(atob(DATA.packed[i]), c => c.charCodeAt(0));
  return JSON.parse(await new Response(new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"))).text());
}
let record = null;
function render() {
  const box = document.getElementById("samples");
  box.innerHTML = "";
  const q = colour, m = q ? scaleOf(record, q) : 1;
  document.getElementById("legend").innerHTML = q ? `${QUANTITIES[q][0]}: <span style="background:${paint(-m, m, QUANTITIES[q][1])}"></span> ${QUANTITIES[q][1] ? (-m).toPrecision(3) + " … 0 … " : "0 … "}<span style="background:${paint(m, m, QUANTITIES[q][1])}"></span> ${m.toPrecision(3)}` : "";
  if (record.kind === "pairs") {
    for (const p of record.pairs) {
      const g = document.createElement("div"); g.className = "group";
      const beta = record.beta == null ? 1 : record.beta, what = record.beta == null ? "Σ (log π_θ − log π_ref)" : "implicit rewards β·Σ (log π_θ − log π_ref)";
      const rw = beta * p.chosen.logp.reduce((s, v, t) => s + v - p.chosen.logp_ref[t], 0);
      const rl = beta * p.rejected.logp.reduce((s, v, t) => s + v - p.rejected.logp_ref[t], 0);
      g.innerHTML = `<div class="prompt">${escapeHtml(p.prompt)}</div><div>${what}: chosen <b>${rw.toFixed(3)}</b>, rejected <b>${rl.toFixed(3)}</b>, margin <b class="${rw > rl ? "good" : "bad"}">${(rw - rl).toFixed(3)}</b></div>`;
      const two = document.createElement("div"); two.className = "pairs";
      for (const [label, side] of [["chosen", p.chosen], ["rejected", p.rejected]]) {
        const c = document.createElement("div"); c.innerHTML = `<b>${label}</b><br>`; side.iter = record.iter;
        c.appendChild(tokensOf(side, q, m)); two.appendChild(c);
      }
      g.appendChild(two); box.appendChild(g);
    }
    return;
  }
  let group = null, g = null;
  for (const row of record.rows) {
    const key = JSON.stringify(row.group);
    if (key !== group) {
      group = key; g = document.createElement("div"); g.className = "group";
      const rows = record.rows.filter(r => JSON.stringify(r.group) === key);
      const right = rows.filter(r => r.verdict > 0).length;
      g.innerHTML = `<div class="prompt">${escapeHtml(row.prompt)} — ${right} of ${rows.length} right</div>`;
      box.appendChild(g);
    }
    const line = document.createElement("div"); line.className = "answer";
    line.appendChild(meta(row)); line.appendChild(tokensOf(row, q, m)); g.appendChild(line);
  }
}
function escapeHtml(s) { const d = document.createElement("div"); d.textContent = s; return d.innerHTML; }
function choose(q) { colour = q; location.hash = "colour=" + q + "&iter=" + DATA.iterations[shown]; render(); }
async function setup() {
  if (!document.getElementById("samples")) return;  // (a ladder's page: no samples of its own)
  if (!DATA.iterations.length) { document.getElementById("samples").innerHTML = "<p>No token records: this run kept none (keep_tokens=0, or an algorithm that does not keep them).</p>"; return; }
  const hash = new URLSearchParams(location.hash.slice(1));
  const wanted = Number(hash.get("iter"));
  shown = Math.max(0, DATA.iterations.indexOf(wanted));
  const iters = document.getElementById("iter");
  DATA.iterations.forEach((it, i) => { const o = document.createElement("option"); o.value = i; o.textContent = `iteration ${it}`; iters.appendChild(o); });
  iters.value = shown;
  iters.onchange = async () => { shown = Number(iters.value); record = await unpack(shown); fillSwitch(); choose(colour); };
  function fillSwitch() {
    const names = available(record), sw = document.getElementById("colour");
    sw.innerHTML = "";
    for (const q of names) { const o = document.createElement("option"); o.value = q; o.textContent = q; sw.appendChild(o); }
    if (!names.includes(colour)) colour = names.includes(hash.get("colour")) ? hash.get("colour") : names[0];
    sw.value = colour;
    sw.onchange = () => choose(sw.value);
  }
  record = await unpack(shown);
  fillSwitch();
  render();
  const box = document.getElementById("samples");
  box.addEventListener("mousemove", e => {
    const s = e.target.closest(".tok");
    if (!s) { tip.style.display = "none"; return; }
    tip.textContent = numbers(s.row, Number(s.dataset.t));
    tip.style.display = "block"; tip.style.left = (e.clientX + 12) + "px"; tip.style.top = (e.clientY + 12) + "px";
  });
  box.addEventListener("mouseleave", () => { tip.style.display = "none"; });
}
setup().then(() => { document.body.dataset.drawnMs = Math.round(performance.now()); });  // (when the page was drawn, after loading)
""".replace("%QUANTITIES%", QUANTITIES)


def packed(record):
    """A kept iteration as gzipped JSON in base64: the page unpacks only the one it shows (the browser's
    DecompressionStream), so a run of many kept iterations opens as fast as one of a few."""
    return base64.b64encode(gzip.compress(json.dumps(record, separators=(",", ":")).encode(), mtime=0)).decode()


def page(title, body, data):
    """The HTML document: the body, the data as JSON (a `</` escaped so no string can close the
    script), the plain script that draws the samples."""
    payload = json.dumps(data, separators=(",", ":")).replace("</", "<\\/")
    return (f"<!DOCTYPE html>\n<html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>{body}<div id='tip'></div>"
            f"<script type='application/json' id='data'>{payload}</script><script>{SCRIPT}</script></body></html>\n")


def run_report(run_dir):
    """The report of one run as an HTML string."""
    config = json.loads(read_text(os.path.join(run_dir, "config.json")) or "{}")
    metrics = os.path.join(run_dir, "metrics.jsonl")
    rows = read_metrics(metrics)[0] if os.path.exists(metrics) else []
    records = token_records(run_dir)
    name = config.get("algo", "?")
    body = (f"<h1>{html.escape(name)}: {html.escape(run_dir)}</h1>"
            f"<p>init_from <code>{html.escape(str(config.get('init_from')))}</code> · {len(rows)} logged rows · "
            f"{len(records)} iterations kept token by token</p>"
            f"<h2>Curves</h2>{curves_svg(rows) if rows else '<p>No metrics.jsonl.</p>'}"
            f"<h3>Monitors</h3>{alarm_list(rows)}"
            f"<h2>Samples, token by token</h2>"
            f"<div id='controls'><label>iteration <select id='iter'></select></label> "
            f"<label>colour by <select id='colour'></select></label> <span id='legend' class='legend'></span>"
            f"<br><small>green: positive, red: negative, purple: a size; hatched grey: written by the tool (masked); "
            f"hover a token for its numbers</small></div><div id='samples'></div>"
            f"<h2>Before and after: held-out answers</h2>{before_after_table(before_and_after(run_dir, config))}"
            f"<h2>Passport</h2><pre class='passport'>{html.escape(read_text(os.path.join(run_dir, 'passport.md')) or 'none')}</pre>"
            f"<h2>Configuration</h2><pre class='passport'>{html.escape(json.dumps(config, indent=1))}</pre>")
    for record in records:
        if record["kind"] == "pairs":
            for pair in record["pairs"]:
                pair["chosen"]["iter"] = pair["rejected"]["iter"] = record["iter"]
    data = dict(iterations=[r["iter"] for r in records], packed=[packed(r) for r in records],
                clip_eps=config.get("clip_eps", 0.2), beta_of={r["iter"]: r.get("beta") for r in records})
    return page(f"{name} report", body, data)


# ----------------------------------------------------------------------------------------------
# The ladder: every stage's held-out answers side by side

def stages(root, order=()):
    """The stage directories under a ladder's root (those with a config.json): those named in `order` in
    its order (the ladder's), then the others in the order they started."""
    found = sorted((d for d in os.listdir(root) if os.path.isfile(os.path.join(root, d, "config.json"))),
                   key=lambda d: os.path.getmtime(os.path.join(root, d, "config.json")))
    return [d for d in order if d in found] + [d for d in found if d not in order]


def ladder_report(root, names):
    """A ladder's report: its plot, every stage's last held-out answers side by side (a row whose
    verdicts differ between stages marked), and a link to each stage's own report."""
    answers = {name: evaluations(os.path.join(root, name)) for name in names}
    answers = {name: found[-1][1] for name, found in answers.items() if found}
    plot = os.path.join(root, "ladder.png")
    body = f"<h1>The ladder: {html.escape(root)}</h1>"
    if os.path.exists(plot):
        body += f"<img alt='the ladder' style='max-width:100%' src='data:image/png;base64,{base64.b64encode(open(plot, 'rb').read()).decode()}'>"
    body += "<h2>The stages' own reports</h2><ul>" + "".join(
        f"<li><a href='{html.escape(name)}/report.html'>{html.escape(name)}</a></li>" for name in names) + "</ul>"
    body += "<h2>Held-out answers, stage by stage</h2>"
    tasks = {}  # each task's stages (the calculator branch answers other problems)
    for name in answers:
        config = json.loads(read_text(os.path.join(root, name, "config.json")))
        tasks.setdefault(config.get("env", "?"), []).append(name)
    for task, cols in tasks.items():
        body += f"<h3>{html.escape(task)}</h3>" + stages_table(cols, answers)
    if not answers:
        body += "<p>No stage saved its held-out answers (answers.jsonl).</p>"
    return page("the ladder", body, dict(iterations=[], packed=[], clip_eps=0.2, beta_of={}))


def stages_table(cols, answers):
    """The stages `cols`' answers to the first one's problems, a column each; a row whose verdicts differ marked."""
    by = {name: {a["prompt"]: a for a in answers[name]} for name in cols}
    right = {name: sum(a["verdict"] > 0 for a in answers[name]) for name in cols}
    rows = ""
    for problem in (a["prompt"] for a in answers[cols[0]]):
        cells = [by[c].get(problem) for c in cols]
        verdicts = {c["verdict"] for c in cells if c}
        rows += (f"<tr class='{'fixed' if len(verdicts) > 1 else ''}'><td>{html.escape(problem)}</td>"
                 + "".join(verdict_cell(c) if c else "<td>–</td>" for c in cells) + "</tr>")
    return ("<p>Each stage's greedy answers at its last evaluation (answers.jsonl); a row whose verdicts differ "
            "between stages is marked.</p><table class='answers'><tr><th>problem</th>"
            + "".join(f"<th>{html.escape(c)} ({right[c]} of {len(answers[c])} right)</th>" for c in cols)
            + f"</tr>{rows}</table>")


def write_report(directory, order=()):
    """report.html of a run directory, or of a ladder's root and each of its stages (`order`: the
    ladder's stage names). Returns its path."""
    if not os.path.isdir(directory):
        raise FileNotFoundError(f"report.py: {directory} is not a directory: pass a run's out_dir (or a ladder's root)")
    if os.path.isfile(os.path.join(directory, "config.json")):
        text = run_report(directory)
    elif stages(directory):
        names = stages(directory, order)
        for name in names:
            write_report(os.path.join(directory, name))
        text = ladder_report(directory, names)
    else:
        raise FileNotFoundError(f"report.py: {directory} holds no config.json and no stage directories: pass a run's "
                                f"out_dir (or a ladder's root)")
    path = os.path.join(directory, "report.html")
    with open(path, "w") as f:
        f.write(text)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        sys.exit(__doc__.split("\n\n")[1] if len(sys.argv) == 2 else "usage: python report.py RUN_DIR")
    try:
        print(f"report: {write_report(sys.argv[1])}")
    except (FileNotFoundError, ValueError) as e:
        sys.exit(f"error: {e}")
