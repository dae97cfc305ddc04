"""Reports are safe to send: hostile strings in a model file and a parameter file stay text.

A tiny llama GGUF (written with the ``gguf`` package) carries ``<script>``, ``<img onerror=...>``,
``</script>`` and attribute-breaking payloads in its name, author, description, chat template and
token list; the parameter file carries more in its scenario name and device. A real batch runs a
test notebook that renders all of it through ``v100lab.workbook.render`` (title, Markdown, tables, code
block, matplotlib labels, print, the headline, an exception message), then headless Chromium
(Debian's ``chromium``) opens the report, the reader's report and the index and we check that no
payload ran. Every payload, had it run, leaves a mark the page cannot contain otherwise: it sets the
title to "X"+"SSRAN" and appends an ``<xss-ran>`` element (the strings are split so the escaped
source text never matches). A control page with the raw payloads proves the check can fail, and
the report and index are also checked with their Content-Security-Policy removed, so escaping —
not only the policy — is what keeps them inert.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import yaml

from v100lab.workbook import runner, render

NB = Path(__file__).parent / "data" / "notebooks"

JS = "document.title='X'+'SSRAN';document.documentElement.appendChild(document.createElement('xss-'+'ran'))"
P_SCRIPT = f"<script>{JS}</script>"
P_IMG = f'<img src=x onerror="{JS}">'
P_CLOSE = f"</script><script>{JS}</script>"
P_ATTR = f"\"'><svg onload=\"{JS}\">"
P_STYLE = f"</style></title><img src=x onerror=\"{JS}\">"
PAYLOADS = (P_SCRIPT, P_IMG, P_CLOSE, P_ATTR, P_STYLE)
NAME = "evil " + P_SCRIPT + " " + P_IMG + " $x$ **b** [l](javascript:alert(1))"


def _chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def write_payload_gguf(path: Path) -> Path:
    """A tiny but complete llama GGUF (1 layer, F32) whose strings are hostile."""
    import gguf
    import numpy as np

    n_vocab, n_embd, n_ff, n_head, n_kv = 16, 32, 64, 4, 2
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name(NAME)
    w.add_author(P_IMG)
    w.add_description(P_CLOSE + P_ATTR + P_STYLE)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(n_embd)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(n_embd // n_head)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list([P_SCRIPT, P_IMG, P_CLOSE] + [f"t{i}" for i in range(n_vocab - 3)])
    w.add_chat_template(P_CLOSE + "{% for m in messages %}{{ m['content'] }}{% endfor %}" + P_STYLE)
    rng = np.random.default_rng(0)
    kv = n_kv * (n_embd // n_head)
    shapes = {"token_embd.weight": (n_vocab, n_embd), "blk.0.attn_norm.weight": (n_embd,),
              "blk.0.attn_q.weight": (n_embd, n_embd), "blk.0.attn_k.weight": (kv, n_embd),
              "blk.0.attn_v.weight": (kv, n_embd), "blk.0.attn_output.weight": (n_embd, n_embd),
              "blk.0.ffn_norm.weight": (n_embd,), "blk.0.ffn_gate.weight": (n_ff, n_embd),
              "blk.0.ffn_up.weight": (n_ff, n_embd), "blk.0.ffn_down.weight": (n_embd, n_ff),
              "output_norm.weight": (n_embd,), "output.weight": (n_vocab, n_embd)}
    for name, shape in shapes.items():
        w.add_tensor(name, rng.standard_normal(shape, dtype=np.float32) * 0.02)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


class _Dom(HTMLParser):
    """What a dumped DOM holds: tags, event-handler attributes, script bodies, text, title."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.tags: list[str] = []
        self.handlers: list[tuple[str, str]] = []
        self.scripts: list[str] = []
        self.text: list[str] = []
        self.title = ""
        self._in: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        self.handlers += [(tag, k) for k, _ in attrs if k.lower().startswith("on")]
        self._in.append(tag)

    def handle_endtag(self, tag):
        if tag in self._in:
            while self._in and self._in.pop() != tag:
                pass

    def handle_data(self, data):
        where = self._in[-1] if self._in else ""
        if where == "script":
            self.scripts.append(data)
        elif where == "title":
            self.title += data
        else:
            self.text.append(data)


def dump_dom(chromium: str, page: Path, tmp: Path) -> _Dom:
    """Load ``page`` in headless Chromium (scripts on), let it run, and parse the resulting DOM."""
    profile = tmp / f"profile-{page.stem}"
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-extensions",
         f"--user-data-dir={profile}", "--virtual-time-budget=3000", "--dump-dom", page.resolve().as_uri()],
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and "<html" in proc.stdout, proc.stderr[-2000:]
    dom = _Dom()
    dom.feed(proc.stdout)
    return dom


def assert_inert(dom: _Dom, what: str) -> None:
    assert "xss-ran" not in dom.tags, f"{what}: a payload ran (element appended)"
    assert "XSSRAN" not in dom.title, f"{what}: a payload ran (title set)"
    assert not dom.handlers, f"{what}: event-handler attributes in the DOM: {dom.handlers[:5]}"
    assert not [s for s in dom.scripts if "SSRAN" in s or "xss-" in s], f"{what}: a payload became a script"
    assert "svg" not in dom.tags, f"{what}: an injected element was parsed"


def _without_csp(page: Path, dest: Path) -> Path:
    html = page.read_text(encoding="utf-8")
    stripped, n = re.subn(r"<meta[^>]*Content-Security-Policy[^>]*>", "", html)
    assert n == 1
    dest.write_text(stripped, encoding="utf-8")
    return dest


@pytest.fixture(scope="module")
def hostile_batch(tmp_path_factory):
    d = tmp_path_factory.mktemp("safety")
    model = write_payload_gguf(d / "evil.gguf")
    params = d / "evil.yaml"
    params.write_text(yaml.safe_dump({"scenario": "scn " + P_IMG + P_CLOSE, "model": str(model),
                                      "device": "dev " + P_SCRIPT + P_ATTR, "n_gen": 3, "n_prompt": 9}))
    out = d / "out"
    result = runner.run_batch([params], [NB / "render_model.ipynb"], out, timeout=120, no_input=True)
    return {"dir": d, "out": out, "result": result, "model": model}


def test_payload_model_is_a_readable_gguf(hostile_batch):
    from v100lab.gguf.header import read_header

    md = read_header(hostile_batch["model"]).metadata
    assert md["general.name"] == NAME and md["tokenizer.chat_template"].startswith(P_CLOSE)


def test_batch_ran_the_render_notebook(hostile_batch):
    (run,) = hostile_batch["result"].runs
    # the notebook renders everything, then raises with the model name as its message (on purpose)
    assert run.status == "error" and run.reason.startswith("ValueError: evil <script>")
    assert run.headline["model"] == NAME and run.headline["measured_tok_s"] == 3.0


def test_report_and_index_source_hold_no_live_payload(hostile_batch):
    """Parsed as HTML (without a browser): no script, no injected element, no event handler."""
    out = hostile_batch["out"]
    (run,) = hostile_batch["result"].runs
    for rel in (run.report, run.reader, "index.html"):
        html = (out / rel).read_text(encoding="utf-8")
        dom = _Dom()
        dom.feed(html)
        assert "script" not in dom.tags and "svg" not in dom.tags and not dom.handlers, rel
        assert "&lt;script&gt;" in html, f"{rel}: the payload should be shown as text"
        text = "".join(dom.text)
        assert P_IMG in text or P_SCRIPT in text, f"{rel}: the payload should be shown as text"
    # the PNG figure was drawn (matplotlib labels from mpl_text)
    assert "data:image/png;base64," in (out / run.report).read_text()


def test_render_helpers_escape_every_payload():
    for p in PAYLOADS:
        for text in (render.md_text("**{x}**", x=p), render.html_text("<b>{x}</b>", x=p),
                     render.title(p).data, render.code(p).data, render.table_html([{p: p}]),
                     render.kv_table({p: p}).data, render.text_table([{p: p, "n": 1.5}], code=[p]).data,
                     render.command(["llama-server", "-m", p, "--alias", p]).data):
            assert "<script" not in text and "<img" not in text and "<svg" not in text, text
    assert render.mpl_text("$x$") == r"\$x\$"


def test_index_escapes_the_headline_configuration_and_partial_reason():
    from v100lab.workbook.runner import RunResult, index_html
    from v100lab.workbook.render import headline_record

    for p in PAYLOADS:
        h = headline_record(None, 1.0, model=p, configuration=p, partial=p)
        r = RunResult(params="p.yaml", notebook="n.ipynb", scenario=p, model=p, device=p, status="ok", reason="",
                      duration_s=1.0, started="", digest="", executed=None, report=None, headline=h)
        html = index_html([r], 1.0)
        assert "<script" not in html.lower() and "<img" not in html and "<svg" not in html, html
        assert "ok (partial)" in html


@pytest.mark.parametrize("fonttype", ["path", "none"])
def test_svg_figures_escape_text(fonttype):
    """Were a notebook to switch the inline backend to SVG, the markup would be embedded as is."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context({"svg.fonttype": fonttype}):
        fig, ax = plt.subplots()
        label = render.mpl_text("--> " + P_SCRIPT + P_IMG + P_ATTR)
        ax.set_title(label)
        ax.set_xlabel(label)
        buf = io.StringIO()
        fig.savefig(buf, format="svg")
        plt.close(fig)
    dom = _Dom()
    dom.feed(buf.getvalue())
    assert "script" not in dom.tags and "img" not in dom.tags and not dom.handlers
    assert dom.tags.count("svg") == 1  # matplotlib's own root element only


@pytest.mark.skipif(_chromium() is None, reason="Chromium is not installed (Debian: apt-get install chromium)")
def test_no_script_runs_in_chromium(hostile_batch, tmp_path):
    chromium = _chromium()
    # control: the same payloads unescaped DO run here, so the check below can fail
    control = tmp_path / "control.html"
    control.write_text("<!DOCTYPE html><html><head><title>control</title></head><body>"
                       + "".join(PAYLOADS) + "</body></html>")
    dom = dump_dom(chromium, control, tmp_path)
    assert "xss-ran" in dom.tags and "XSSRAN" in dom.title

    out = hostile_batch["out"]
    (run,) = hostile_batch["result"].runs
    pages = {"report": out / run.report, "reader": out / run.reader, "index": out / "index.html"}
    for what, page in pages.items():
        dom = dump_dom(chromium, page, tmp_path)
        assert_inert(dom, what)
        text = "".join(dom.text)
        assert P_SCRIPT in text or "<script>document.title" in text, f"{what}: payload not shown as text"
    # escaping alone keeps them inert: the same pages without their Content-Security-Policy
    for what in ("report", "index"):
        # same folder as the original, so relative links resolve the same way; removed afterwards
        page = _without_csp(pages[what], pages[what].with_name(f"nocsp-{pages[what].name}"))
        try:
            assert_inert(dump_dom(chromium, page, tmp_path), f"{what} without CSP")
        finally:
            page.unlink()
