"""The claim check: every number a lesson's text types in is printed by an output of that lesson.

A **typed number** is a number in a lesson's markdown (outside code spans, code blocks and link targets) that is

* a decimal (``3.47``, ``0.5``, ``1.3``),
* an integer of 100 or more (``1,588``, ``4096``, ``500,000``: a count, a size or a config value), or
* any number written with a unit or a ratio sign right after it: ``4.09x``, ``4×``, ``+11.6%``, ``0.075 nats``,
  ``64 s``, ``8.6 GiB``, ``70,272 B/token`` (the units are ``UNITS`` below; in a range such as ``4-7 nats`` or
  ``0.075–0.085 nats`` both ends carry the unit).

Not typed numbers, because they name rather than state: integers under 100 without a unit (``2 layers``, ``d_h =
64`` is caught as 64 only with a unit), years (``2019``), the numbers of lessons, sections, exercises, tables and
steps (``lesson 04``, ``section 16``, ``Table 1``, a heading's or a numbered list's ``3.``), versions after a model's
or a tool's name (``Llama 3.1``, ``Python 3.10``), exponents and indices in formulas (``2^{30}``, ``q_{31}``) and
names that run into letters (``Qwen3-0.6B``, ``70B``, ``3.5d``).

A typed number passes when some output of the same lesson (stdout, or the plain-text form of a result) prints a
number equal to it at the text's precision (``71x`` is printed as ``71.1x``, ``+11.6%`` as ``11.63%``), or when it is
a published constant listed in ``EXEMPT`` (a paper's figure, a datasheet's, a standard value) with its source.
Everything else fails, with the sentence that states it.

Parametrised over the lessons (``notebooks/NNx_*.ipynb``: ``09_``, ``09b_``) and their solutions
(``solutions/NNx_*.ipynb``) as they are on disk, so notebooks being written now are covered as they land.
"""

import json
import re
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Decimal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LESSON_NAME = re.compile(r"(\d\d[a-z]?)_")  # 09_real_model, 09b_rope_scaling: the lesson is "09", "09b"
NOTEBOOKS = sorted(p for folder in ("notebooks", "solutions") for p in (ROOT / folder).glob("*.ipynb")
                   if LESSON_NAME.match(p.name))
LESSONS = [p for p in NOTEBOOKS if p.parent.name == "notebooks"]

UNITS = ("x", "×", "%", "nats", "nat", "bits", "bit", "bpc", "s", "ms", "µs", "us", "ns", "seconds", "minutes",
         "GiB", "MiB", "KiB", "TiB", "GB", "MB", "KB", "kB", "TB", "B", "bytes", "FLOPs", "FLOP", "tokens/s",
         "GB/s", "GiB/s", "TFLOP/s", "GFLOP/s")
SAME_UNIT = {"×": "x", "bytes": "B", "nat": "nats", "bit": "bits", "seconds": "s", "FLOP": "FLOPs"}
SCALES = {"K": 10**3, "thousand": 10**3, "M": 10**6, "million": 10**6, "billion": 10**9}
# Published constants a lesson may state without printing them: {lesson number or "*": {text: why}}.
# ``text`` is the number as the claim check reads it, unit included (the failure message shows it).
EXEMPT: dict[str, dict[str, str]] = {
    "*": {"8x": "the short card's headline claim, quoted to refute it (COURSE.md)",
          "95%": "the confidence level of the course's intervals (COURSE.md, Statistics)"},
    "00": {"0.044715": "the constant of GPT-2's tanh GELU (Hendrycks & Gimpel, 2016)",
           "0.02": "GPT-2's initial standard deviation (Radford et al., 2019; OpenAI's gpt-2 code)"},
    "02": {"2.67": "8/3, the SwiGLU sizing ratio (arithmetic)"},
    "04": {"5%": "the GQA paper's uptraining budget (Ainslie et al., 2023)"},
    "05": {"1,536": "DeepSeek-V3's query latent, q_lora_rank in its config.json (DeepSeek-AI, 2024)"},
    "09": {"18 B": "a Q4_0 block's size, an fp16 step and 16 bytes of codes (ggml's block_q4_0; solutions/09)"},
    "08": {"1.4697": "nanoGPT's published validation loss on an A100",
           "90%": "the configured training split", "10%": "the configured validation split",
           "8.03 billion": "Llama 3 8B's published parameter count (Meta's model card): exercise 4's given",
           "8.03": "Llama 3 8B's published parameter count, 8.03 × 10^9 (Meta's model card): exercise 4's given"},
    "10": {"989 TFLOP/s": "an H100 SXM's published dense bf16 peak (NVIDIA's datasheet)",
           "3.35 TB": "an H100 SXM's published memory bandwidth, 3.35 TB/s (NVIDIA's datasheet)"},
}

_WORD_UNIT = "|".join(re.escape(u) for u in sorted(set(UNITS) - {"x", "×", "%", "B"}, key=len, reverse=True))
_NUMBER = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][+-]?\d+)?"
# One number, or a range "a-b" / "a–b" / "a to b"; then an optional scale (134.2M, 70.6 billion) and an optional
# unit: x, × and % written tight ("16 x 128" is a product), words with or without a space, B (bytes) only after a
# space ("70B" is a model's name).
_CLAIM = re.compile(
    rf"(?<![\w.])(?P<first>{_NUMBER})(?:\s?(?:[-–]|to)\s?(?P<second>{_NUMBER}))?"
    rf"(?P<scale>[KM](?![a-zA-Z])|\s(?:thousand|million|billion)\b)?"
    rf"(?P<unit>x|×|%|\s?(?:{_WORD_UNIT})|\sB)?(?P<end>(?!\w))?")


def _significant_digits(number: str) -> int:
    mantissa = re.split(r"[eE]", number.replace(",", ""))[0]
    return len(mantissa.replace(".", "").lstrip("0"))


def _decimals(number: str) -> int:
    """The number's precision as a power of ten: 4.09 -> 2, 71 -> 0, 1.5e-3 -> 4."""
    mantissa, *exponent = re.split(r"[eE]", number.replace(",", ""))
    places = len(mantissa.split(".")[1]) if "." in mantissa else 0
    return places - (int(exponent[0]) if exponent else 0)


def _unit(match: re.Match) -> str:
    unit = (match["unit"] or "").strip()
    return SAME_UNIT.get(unit, unit)


def _scale(match: re.Match) -> int:
    return SCALES[match["scale"].strip()] if match["scale"] else 1


def prose(markdown: str) -> str:
    """The markdown a reader reads as text: no code blocks, code spans, link targets, HTML tags, URLs or arXiv ids;
    LaTeX's thousands separators and times signs read as text."""
    text = re.sub(r"```.*?```", " ", markdown, flags=re.S)
    text = re.sub(r"`(?:[^`\n]|\n(?!\s*\n))*`", "‹code›", text)  # a code span may wrap, never across a paragraph
    text = re.sub(r"\]\([^)]*\)", "]", text)
    text = re.sub(r"https?://\S+|arXiv:\s?\S+", " ", text)
    text = re.sub(r"<[^>]+>", " ", text)
    text = text.replace("{,}", ",").replace("\\,", " ").replace("\\%", "%").replace("\\times", "×")
    return text.replace("$", "")


_BOUNDARY = re.compile(r"[.!?]\s|\n\s*\n|\n(?=\s*(?:[-*|#]|\d+\.)\s)")


def _sentence(text: str, start: int, end: int) -> str:
    """The sentence (or list item, or table row) around text[start:end]."""
    left = max((m.end() for m in _BOUNDARY.finditer(text, 0, start)), default=0)
    right = next((m.start() + 1 for m in _BOUNDARY.finditer(text, end)), len(text))
    return " ".join(text[left:right].split())


# what stands right before a number that names rather than states: a lesson, section, ... number; a version after a
# model's or a tool's name; an exponent or an index in a formula
_NAMING = re.compile(
    r"(?:\b(?:[Ll]essons?|[Ss]ections?|[Ee]xercises?|[Cc]hapters?|[Tt]ables?|[Ff]igures?|[Cc]ells?|[Pp]arts?|"
    r"[Ss]teps?|[Hh]ints?|[Qq]uestions?|[Pp]itfalls?|[Rr]ungs?|[Ll]ayers?|[Hh]eads?|[Pp]airs?|[Pp]ositions?|[Rr]ows?|"
    r"[Ss]eeds?|[Bb]locks?|[Bb]ytes?|[Vv]ersions?|Llama|Gemma|Qwen\d?|GPT|Mistral|Mixtral|DeepSeek|Kimi|Phi|Python|"
    r"SmolLM\d?|PyTorch|torch|transformers|CUDA|v)[- ]?|[\^_]\{?|\^\{-|\bc)$")
_HEADING_OR_ITEM = re.compile(r"(?:^|\n)\s*(?:#+\s*|[-*]\s+)?$")


def _names_rather_than_states(text: str, match: re.Match, number: str, unit: str) -> bool:
    before = text[max(0, match.start() - 30):match.start()]
    if _NAMING.search(before):
        return True
    if _HEADING_OR_ITEM.search(before) and text[match.end():match.end() + 1] == ".":
        return True  # "## 11. Title", "3. Fine-tune each variant"
    if unit or "." in number or re.search(r"[eE]", number):
        return False
    value = int(number.replace(",", ""))
    return value < 100 or ("," not in number and 1900 <= value <= 2099)  # a small count, or a year


def typed_numbers(markdown: str, every: bool = True) -> list[tuple[str, str]]:
    """(the number as written, with its scale and unit; the sentence it stands in) for each typed number; with
    ``every=False`` only the measured ones (a unit, or a decimal of three significant digits or more)."""
    text = prose(markdown)
    found = []
    for match in _CLAIM.finditer(text):
        if match["end"] is None:
            continue  # the number runs into a word: a name such as Qwen3-0.6B or 3.5d, not a measurement
        unit = _unit(match)
        first, second = match["first"], match["second"]
        if _names_rather_than_states(text, match, first, unit) and (
                second is None or _names_rather_than_states(text, match, second, unit)):
            continue
        for number in filter(None, (first, second)):
            if not every and not (unit or "." in number and _significant_digits(number) >= 3):
                continue
            scale = (match["scale"] or "").strip()
            written = number + (" " + scale if len(scale) > 1 else scale)
            written += unit if unit in ("x", "%") else (" " + unit if unit else "")
            found.append((written, _sentence(text, match.start(), match.end())))
    return found


def printed_numbers(outputs: list[str]) -> list[tuple[Decimal, int, str]]:
    """(value, precision as in _decimals, unit printed right after it or "") for every number the outputs print."""
    found = []
    for match in (m for text in outputs for m in _CLAIM.finditer(text)):
        for number in filter(None, (match["first"], match["second"])):
            scale = _scale(match)
            found.append((Decimal(number.replace(",", "")) * scale,
                          _decimals(number) - len(str(scale)) + 1, _unit(match)))
    return found


def is_printed(claim: str, printed: list[tuple[Decimal, int, str]]) -> bool:
    """Whether some printed number equals ``claim`` at the text's precision. A claim written with x, × or % needs the
    same sign printed after the number; one with another unit, that unit or none (a table's header may carry it)."""
    match = _CLAIM.fullmatch(claim)
    scale = _scale(match)
    target, places, unit = Decimal(match["first"].replace(",", "")) * scale, _decimals(match["first"]), _unit(match)
    places -= len(str(scale)) - 1
    quantum = Decimal(1).scaleb(-places)
    for value, precision, printed_unit in printed:
        if precision < places:
            continue  # printed more coarsely than the text states it
        if (unit in ("x", "%") and printed_unit != unit) or (unit and printed_unit not in ("", unit)):
            continue
        for rounding in (ROUND_HALF_EVEN, ROUND_HALF_UP):
            if abs(value).quantize(quantum, rounding=rounding) == abs(target).quantize(quantum):
                return True
    return False


def output_texts(cell: dict) -> list[str]:
    """What a code cell's outputs print as text: streams and the plain-text form of results (not widget HTML)."""
    texts = []
    for out in cell.get("outputs", []):
        if out.get("output_type") == "stream" and out.get("name") == "stdout":
            texts.append("".join(out.get("text", "")))
        elif out.get("output_type") in ("display_data", "execute_result"):
            plain = out.get("data", {}).get("text/plain", "")
            texts.append("".join(plain))
    return texts


def unprinted_claims(notebook: dict, lesson_number: str, every: bool = True) -> list[tuple[str, str]]:
    cells = notebook.get("cells", [])
    printed = printed_numbers([t for c in cells if c.get("cell_type") == "code" for t in output_texts(c)])
    exempt = {**EXEMPT["*"], **EXEMPT.get(lesson_number, {})}
    claims = []
    for cell in cells:
        if cell.get("cell_type") != "markdown":
            continue
        for number, sentence in typed_numbers("".join(cell.get("source", "")), every):
            if number not in exempt and not is_printed(number, printed):
                claims.append((number, sentence))
    return claims


def lesson_of(path: Path) -> str:
    return LESSON_NAME.match(path.name).group(1)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_typed_number_is_printed(path):
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        pytest.fail(f"{path.name}: not a readable notebook ({err})")
    # an exercise states the givens of its problem (a model's config, a format's layout): there only the measured
    # numbers must be printed
    claims = unprinted_claims(notebook, lesson_of(path), every=path.parent.name == "notebooks")
    assert not claims, (
        f"{path.name}: {len(claims)} typed number(s) in the text that no output of the lesson prints "
        "(print them from a cell, or list a published constant in EXEMPT with its reason):\n"
        + "\n".join(f"  {number!r} in: {sentence[:300]}" for number, sentence in claims))


# ---- the rule itself ----------------------------------------------------------------------------------


SAMPLE = ("The ratio is 4.09x and the FFN grows +11.6%; NTK loses 0.075–0.085 nats. It took 64 s and 8.6 GiB, "
          "70,272 B per token. Llama 3 70B has 80 layers, d = 8192, 3,283,456 parameters, lr 1e-3, eps 0.5, "
          "base 10,000 (2019). The mean was 3.47, in `code 9.999x`, see [x](http://a.b/1.234x)."
          " $151{,}936 \\times 1{,}024$ and 682.7.")


def test_what_counts_as_a_typed_number():
    assert [n for n, _ in typed_numbers(SAMPLE)] == [
        "4.09x", "11.6%", "0.075 nats", "0.085 nats", "64 s", "8.6 GiB", "70,272 B", "8192", "3,283,456", "1e-3", "0.5",
        "10,000", "3.47", "151,936", "1,024", "682.7"]
    named = ("## 11. Lesson 04 and lessons 00-08, section 16, Table 1, Exercise 2 and step 2,000 of Llama 3.1,"
             " Qwen2.5 and Python 3.10 (2019): layers 10 and 11 of 30, 2^{30} bytes and q_{31}.\n"
             "3. Fine-tune each variant.")
    assert typed_numbers(named) == []


def test_an_exercise_is_held_to_its_measured_numbers_only():
    """An exercise states its problem's givens (a config, a format); only measured numbers must be printed."""
    assert [n for n, _ in typed_numbers(SAMPLE, every=False)] == [
        "4.09x", "11.6%", "0.075 nats", "0.085 nats", "64 s", "8.6 GiB", "70,272 B", "3.47", "682.7"]


def test_a_number_is_printed_at_the_texts_precision():
    printed = printed_numbers(["ratio 71.1x, gap +11.63%, 4.0913 ms", "1,050,673,152 = 1.5% of them, 2.04 GiB 7"])
    assert [(str(v), u) for v, _, u in printed[:3]] == [("71.1", "x"), ("11.63", "%"), ("4.0913", "ms")]
    assert is_printed("71x", printed) and is_printed("11.6%", printed) and is_printed("4.09 ms", printed)
    assert is_printed("1.5%", printed) and is_printed("1,050,673,152", printed) and is_printed("2.0 GiB", printed)
    assert not is_printed("4.10 ms", printed) and not is_printed("11.64%", printed) and not is_printed("72x", printed)
    assert not is_printed("7%", printed) and not is_printed("7x", printed) and is_printed("7 GiB", printed)
    assert not is_printed("2.0 ms", printed)  # printed, but in GiB


def test_an_unprinted_claim_fails_and_a_printed_one_passes():
    def notebook(text, printed):
        return {"cells": [{"cell_type": "markdown", "source": text},
                          {"cell_type": "code", "source": "", "outputs": [
                              {"output_type": "stream", "name": "stdout", "text": printed}]}]}

    assert unprinted_claims(notebook("RMSNorm is 4.09x faster.", "ratio 2.04x\n"), "01") == [
        ("4.09x", "RMSNorm is 4.09x faster.")]
    assert unprinted_claims(notebook("RMSNorm is about 2x faster.", "ratio 2.04x\n"), "01") == []
    assert unprinted_claims(notebook("fp16 stops at 65,504 and 2π ≈ 6.3.", ""), "01") == [
        ("65,504", "fp16 stops at 65,504 and 2π ≈ 6.3."), ("6.3", "fp16 stops at 65,504 and 2π ≈ 6.3.")]
    assert unprinted_claims(notebook("fp16 stops at 65,504 and 2π ≈ 6.3.", ""), "01", every=False) == []
    assert unprinted_claims(notebook("The card says 8x.", ""), "07") == []  # exempt


def test_every_exemption_is_still_used():
    """An exemption whose number no lesson states any more is stale: remove it."""
    stated: dict[str, set[str]] = {}
    for path in NOTEBOOKS:
        stated.setdefault(lesson_of(path), set()).update(
            n for c in json.loads(path.read_text(encoding="utf-8")).get("cells", [])
            if c.get("cell_type") == "markdown" for n, _ in typed_numbers("".join(c.get("source", ""))))
    everywhere = set().union(*stated.values())
    stale = [(lesson, number) for lesson, numbers in EXEMPT.items() for number in numbers
             if number not in (everywhere if lesson == "*" else stated.get(lesson, set()))]
    assert not stale, f"exemptions no lesson needs any more (remove them from EXEMPT): {stale}"
