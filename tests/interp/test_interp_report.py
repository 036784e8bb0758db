"""The report is one self-contained file: no resource is loaded from a URL.

What we check: the HTML has no *resource loads* from http(s) (script/link/img/iframe src or
href, ES ``import``/``import()``, CSS ``url()``/``@import``, ``fetch``/XHR of a URL literal) and
no source-map reference. URL strings inside the inlined plotly.js / circuitsvis code (comments,
licence headers, SVG namespaces) are not resource loads and are allowed.
"""

import json
import re

import plotly.graph_objects as go
import pytest

from lenslab.interp.inspect import inspect_run
from lenslab.interp.visual import AttentionView, attention_view
from lenslab.report import inspection_sections, write_report

URL = r"""["']?\s*(?:https?:)?//"""
RESOURCE_LOADS = [
    re.compile(r"<(?:script|img|iframe|source|embed|audio|video)\b[^>]*\bsrc\s*=\s*" + URL, re.IGNORECASE),
    re.compile(r"<link\b[^>]*\bhref\s*=\s*" + URL, re.IGNORECASE),
    re.compile(r"\bimport\s*\(\s*[\"'`](?:https?:)?//", re.IGNORECASE),
    re.compile(r"\bimport\b[^;\n]{0,200}?\bfrom\s*[\"'](?:https?:)?//", re.IGNORECASE),
    re.compile(r"@import\s+(?:url\()?\s*[\"']?(?:https?:)?//", re.IGNORECASE),
    re.compile(r"url\(\s*[\"']?https?://", re.IGNORECASE),
    re.compile(r"\bfetch\s*\(\s*[\"'`]https?://", re.IGNORECASE),
    re.compile(r"sourceMappingURL", re.IGNORECASE),
]


def resource_loads(html: str) -> list[str]:
    return [m.group(0)[:120] for p in RESOURCE_LOADS for m in p.finditer(html)]


def test_detector_catches_circuitsvis_cdn_html(trained, splits):
    """Control: circuitsvis's own default (CDN) HTML is flagged, so the check can fail."""
    import circuitsvis as cv

    pattern = trained.run_with_cache(splits["validation_tokens"][:1])[1]["blocks.0.attn.hook_pattern"][0]
    cdn = cv.attention.attention_heads(pattern, tokens=list("abcde")).cdn_src
    assert resource_loads(cdn)
    assert resource_loads('<script src="https://cdn.plot.ly/plotly.min.js"></script>')


def test_report_is_offline_and_inlines_bundles_once(tmp_path, trained, splits):
    fig = go.Figure(go.Scatter(x=[0, 1], y=[1, 0]))
    views = [attention_view(trained, splits["validation_tokens"][i], 8, title=f"ex {i}") for i in range(2)]
    path = write_report(tmp_path / "r.html", "t", [("A", [fig, "some <text> & stuff", "<p>raw</p>"]), ("B", views)])
    html = path.read_text()
    assert resource_loads(html) == []
    assert html.count("var CircuitsVis=") == 1  # bundle once for two views
    assert html.count('CircuitsVis.render("') == 2
    assert html.count("Plotly.newPlot") >= 1 and html.count("plotly.js v") <= 2  # plotly.js inlined (its banner) once
    assert "some &lt;text&gt; &amp; stuff" in html


def test_every_notebook_view_carries_the_packed_bundle(trained, splits):
    import base64
    import gzip
    from pathlib import Path

    import circuitsvis

    from lenslab.interp import visual

    v = attention_view(trained, splits["validation_tokens"][0], 8)
    first, second = v._repr_html_(), AttentionView(v_attention(trained, splits), list("abcde"), ["h"])._repr_html_()
    packed = visual.circuitsvis_packed()
    assert packed in first and packed in second  # each output self-contained (issue 27 item 5)
    assert "var CircuitsVis=" not in first  # ... packed, not the plain 1.3 MB bundle
    shipped = (Path(circuitsvis.__file__).parent / "dist" / "cdn" / "iife.js").read_text(encoding="utf-8")
    unpacked = gzip.decompress(base64.b64decode(packed)).decode("utf-8")
    assert unpacked == shipped.replace("//# sourceMappingURL=iife.js.map", "")  # the wheel's bundle, byte for byte
    assert len(first) < 0.4 * len(shipped)  # the size a view costs: gzip + base64, about 37 % of the bundle
    assert resource_loads(first) == [] and resource_loads(second) == []


def v_attention(trained, splits):
    return trained.run_with_cache(splits["validation_tokens"][:1])[1]["blocks.0.attn.hook_pattern"][0, :1]


@pytest.fixture(scope="module")
def inspected(fake_run):
    return inspect_run(fake_run, max_pairs=64, max_examples=128, trap_checkpoints=3)


def test_inspect_run_end_to_end(fake_run, inspected):
    result = inspected
    json.dumps(result)  # numbers only
    assert result["limits"]["patching_pairs"] == 64
    assert set(result["patching"]) == {"validation->counterfactual", "counterfactual->validation"}
    assert len(result["evolution"]["rows"]) == len(result["evolution"]["epochs_used"])
    sections = inspection_sections(fake_run, result)
    headings = [h for h, _ in sections]
    for h in (
        "Accuracy",
        "Gradient dynamics",
        "Circuit evolution",
        "Cross-split patching",
        "Correlation traps",
        "Attention (readout is the last row)",
    ):
        assert h in headings
    html = write_report(fake_run / "report.html", "demo", sections).read_text()
    assert resource_loads(html) == []


def test_inspect_run_traps(fake_run, inspected):
    """The report's trap numbers equal detect_traps on each checkpoint's matrices, taken in memory."""
    from lenslab.interp.spectral import detect_traps, extract_matrices
    from lenslab.training.run import Run

    result = inspected
    traps = result["traps"]
    run = Run.open(fake_run)
    assert traps["n_checkpoints"] == 4 and len(traps["epochs_used"]) == 3
    assert traps["epochs_used"][0] == 0 and traps["epochs_used"][-1] == 120  # first and last kept
    for epoch in traps["epochs_used"]:
        mats = extract_matrices(run.model(epoch)).matrices
        got = {r["matrix"]: (r["n_traps"], r["lambda_plus"]) for r in traps["rows"] if r["epoch"] == epoch}
        assert set(got) == set(mats)
        for name, w in mats.items():
            ref = detect_traps(w, name, mode="robust", seed=0)
            # the same float64 eigen-solve on the same matrix, maybe in a worker with another thread count: ~1e-13
            assert got[name][0] == ref.n_traps and got[name][1] == pytest.approx(ref.lambda_plus, rel=1e-9)
    assert traps["final"] == {r["matrix"]: r["n_traps"] for r in traps["rows"] if r["epoch"] == 120}
    at = [r for r in traps["rows"] if r["epoch"] == traps["esd_epoch"]]
    assert (
        traps["esd_epoch"] == result["epoch"]
        and traps["esd_matrix"] == max(at, key=lambda r: (r["n_traps"], r["N"] * r["M"]))["matrix"]
    )
    items = dict(inspection_sections(fake_run, result))["Correlation traps"]
    figs = [i for i in items if isinstance(i, go.Figure)]
    assert len(figs) == 2  # trap counts under the accuracy curves; the ESD with its MP fit
    assert {"train_acc", "blocks.0.mlp.W_in"} <= {t.name for t in figs[0].data}
    assert traps["esd_matrix"] in figs[1].layout.title.text


def test_each_head_keeps_one_colour_across_the_fingerprint_panels():
    from lenslab.interp.visual import fingerprint_evolution_figure

    rows = [
        {"epoch": e, "head_name": h, "qk_rho_w": 0.1, "pos0_mass_w": 0.2, "ov_parity_rho_w": 0.3}
        for e in (0, 5)
        for h in ("L0H0", "L0H1", "L1H0")
    ]
    fig = fingerprint_evolution_figure(rows)
    colours: dict[str, set] = {}
    for tr in fig.data:
        colours.setdefault(tr.name, set()).add(tr.line.color)
    assert all(len(c) == 1 and None not in c for c in colours.values())  # one explicit colour per head, in all three panels
    assert len({next(iter(c)) for c in colours.values()}) == 3  # and different heads differ


def test_the_limits_line_reads_as_a_sentence():
    from lenslab.report import _limits_sentence

    text = _limits_sentence(
        {"patching_pairs": 256, "max_examples": 2048, "evolution": "12 of 40 checkpoints", "traps": "robust mode"}
    )
    assert (
        text
        == "Limits: cross-split patching on 256 pairs, at most 2048 examples per split; evolution: 12 of 40 checkpoints; traps: robust mode."
    )
    assert "{" not in text


def test_views_say_what_they_are_without_javascript(trained, splits):
    from html.parser import HTMLParser

    from lenslab.interp import visual

    class Text(HTMLParser):  # what a viewer that runs no script shows: the text outside <script>
        def __init__(self):
            super().__init__()
            self.parts, self.in_script = [], False

        def handle_starttag(self, tag, attrs):
            self.in_script |= tag == "script"

        def handle_endtag(self, tag):
            self.in_script &= tag != "script"

        def handle_data(self, data):
            if not self.in_script:
                self.parts.append(data)

    v = attention_view(trained, splits["validation_tokens"][0], 8, title="ex 0")
    html = v._repr_html_()
    t = Text()
    t.feed(html)
    shown = " ".join(" ".join(t.parts).split())
    assert visual.STATIC_NOTE in shown and "ex 0" in shown
    assert visual.OLD_BROWSER_NOTE in html and visual.UNPACK_FAILED_NOTE in html  # the script's fallbacks, not shown
    assert visual.MISSING_NOTE in v.html() and visual.MISSING_NOTE not in html  # a report's view needs the page's bundle
    assert (
        repr(v)
        == f"AttentionView('ex 0', {trained.cfg.n_heads * trained.cfg.n_layers} heads x {splits['validation_tokens'].shape[1]} tokens)"
    )
