"""experiments/ask_session.py on a tiny chat model: a session's bytes per stored token are
the store's record (keys and values, float16, each retrieving layer), the loaded session
answers as the read one did, and the page's table is rendered between its markers."""

import ask_session
import pytest

pytest.importorskip("transformers")

from tiny_pretrained import write_tiny_model  # noqa: E402

SMALL = dict(block_size=8, blocks=2, sink_blocks=1, window=32, segment_len=16)


def test_a_session_is_measured_and_rendered(tmp_path):
    from inftyformer.data.paths import EMBEDDED_CORPUS

    book = sorted(EMBEDDED_CORPUS.rglob("*.txt"))[0]  # any book: the one the package carries
    base = write_tiny_model(tmp_path / "model", chat=True, max_positions=512)
    row = ask_session.measure(str(base), book, 300, None, 0, **SMALL)
    assert row["same_answer"] and row["tokens"] > 300 and row["stored_tokens"] > 200
    # 2 retrieving layers (the default reads past blocks in every block), 2 key/value heads of
    # 8: 2 layers · 2 (keys, values) · 2 heads · 8 · 2 bytes
    assert row["block_bytes_per_stored_token"] == 128
    assert row["bytes"]["blocks"] == 128 * row["stored_tokens"]
    page = tmp_path / "ask.md"
    page.write_text(f"intro\n{ask_session.BEGIN}\nold\n{ask_session.END}\nrest\n")
    data = {"base_model": str(base), "command": "python x", "machine": {"cpu": "c"},
            "rows": [row]}  # fmt: skip
    ask_session.write_page(data, page)
    text = page.read_text()
    assert text.startswith("intro\n") and text.endswith("\nrest\n") and "old" not in text
    assert f"| {row['tokens']:,} | None |" in text
