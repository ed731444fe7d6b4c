"""Model names in logs: which catalog model a logged ``model`` value names.

Logs name a deployment the way its server or gateway does: ``meta-llama/Llama-3.1-70B-Instruct``
(vLLM's served name, the Hugging Face id), ``hosted_vllm/meta-llama/Llama-3.1-70B-Instruct``
(a LiteLLM provider prefix), ``RedHatAI/Llama-3.1-70B-Instruct-FP8`` (a quantized copy),
``my-70b`` (the name the deployment was given). The catalog names models by id
(``llama-3.1-70b``) and records each one's Hugging Face id. :func:`resolve_model_name` is the one
place the two meet; the rules, in order (the first that names a model wins):

1. **alias**: the project's ``[models]`` table (rooftrace.toml, passed as ``aliases``) maps the
   name, as logged, to a catalog id (``"my-70b" = "llama-3.1-70b"``); case is ignored when no alias matches exactly.
2. **id** / **hf_id**: the name is a catalog id; else its last two path parts are a catalog
   model's Hugging Face id; else its last part is a catalog id, or the name part of a Hugging
   Face id (case ignored throughout; what comes before is a provider prefix, and the
   organisation of a copy, ``RedHatAI/``, ``unsloth/``, does not matter).
3. **variant**: suffixes of instruction-tuned and quantized copies are dropped from the end one at
   a time (``-Instruct``, ``-Chat``, ``-it``, ``-hf``, ``-FP8``, ``-AWQ``, ``-GPTQ``, ``-Int4``,
   ``-W4A16``, ``-bnb-4bit``, ``-GGUF``, ``-Turbo``, ...), the old ``Meta-Llama-`` spelling
   reads as ``Llama-``, and Fireworks' ``accounts/<a>/models/llama-v3p1-70b`` as
   ``llama-3.1-70b``; after each drop the name is compared with every catalog id and Hugging
   Face name, and finally with those names' own variant-free forms.

A step that finds two catalog models names none: the name stays unresolved, with the candidates
said (:attr:`NameMatch.candidates`), because a guess between two models would size the wrong
fleet. A name that resolves to nothing (``unknown``, an API model) keeps its own spelling
everywhere it is used.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache

from pipeline.catalog.entries import list_models, load_model

#: Trailing name parts of copies of a model that share its architecture: instruction tuning,
#: quantization, a serving tier. Dropped one at a time from the end (case ignored), each after a
#: '-', '_' or '.'.
VARIANT_SUFFIXES: tuple[str, ...] = (
    "instruct",
    "chat",
    "it",
    "hf",
    "fp8",
    "fp8-dynamic",
    "dynamic",
    "fp4",
    "nvfp4",
    "mxfp4",
    "fp16",
    "bf16",
    "awq",
    "gptq",
    "int4",
    "int8",
    "w4a16",
    "w8a8",
    "w8a16",
    "w4a8",
    "quantized.w4a16",
    "quantized.w8a8",
    "quantized.w8a16",
    "bnb-4bit",
    "bnb-8bit",
    "4bit",
    "8bit",
    "gguf",
    "turbo",
    "maas",
    "versatile",
    "instant",
)

_SUFFIX_RE = re.compile(
    r"[-_.](" + "|".join(re.escape(s) for s in sorted(VARIANT_SUFFIXES, key=len, reverse=True)) + r"|\d{4})$",
    re.IGNORECASE,
)
#: ``-Instruct`` / ``-Chat`` before a version tag: ``Mixtral-8x7B-Instruct-v0.1`` (of ``Mixtral-8x7B-v0.1``).
_INFIX_RE = re.compile(r"[-_](instruct|chat)(?=[-_]v\d+(?:\.\d+)*$)", re.IGNORECASE)
#: Longer names name no catalog model (a Hugging Face id is at most 96 characters), and at most
#: this many suffixes are dropped: a hostile log's name costs bounded time.
MAX_NAME_CHARS = 512
MAX_DROPPED = 8

#: Fireworks' path: ``[fireworks_ai/]accounts/<account>/models/<name>``.
_FIREWORKS_RE = re.compile(r"(?:^|/)accounts/[^/]+/models/([^/]+)$", re.IGNORECASE)


@dataclass(frozen=True)
class CatalogName:
    """A catalog model's names: its id and its Hugging Face id."""

    model: str
    hf_id: str


@dataclass(frozen=True)
class NameMatch:
    """What a logged model name names.

    ``model`` is the catalog id (None: none, or more than one); ``how`` is "alias", "id",
    "hf_id", "variant", "ambiguous" or "none"; ``detail`` says what was read past (a provider
    prefix, dropped suffixes); ``candidates`` are the catalog models an ambiguous name could be."""

    logged: str
    model: str | None
    how: str
    detail: str = ""
    candidates: tuple[str, ...] = ()

    def describe(self) -> str:
        """One line: ``'<logged>' -> llama-3.1-70b (hf_id; provider prefix 'hosted_vllm/')``."""
        if self.how == "ambiguous":
            return f"{self.logged!r} could be {', '.join(self.candidates)}: not resolved (a [models] alias decides)"
        if self.model is None:
            return f"{self.logged!r} names no catalog model"
        extra = f"; {self.detail}" if self.detail else ""
        return f"{self.logged!r} -> {self.model} ({self.how}{extra})"


@cache
def catalog_names() -> tuple[CatalogName, ...]:
    """Every catalog model's id and Hugging Face id (read once)."""
    return tuple(CatalogName(name, load_model(name).hf_id) for name in list_models())


def _norm(name: str) -> str:
    """Case folded; the old ``Meta-Llama-`` repository names read as the current ``Llama-``."""
    low = name.strip().lower()
    return "llama-" + low[len("meta-llama-") :] if low.startswith("meta-llama-") else low


def _fireworks(name: str) -> str:
    """Fireworks' spelling of a version, ``llama-v3p1-70b``, as ``llama-3.1-70b``."""
    return re.sub(r"(?<=\d)p(?=\d)", ".", re.sub(r"-v(?=\d)", "-", name, flags=re.IGNORECASE), flags=re.IGNORECASE)


def _strip_variants(name: str) -> tuple[list[str], list[str]]:
    """``name`` and each form with one more variant suffix dropped from its end; the suffixes."""
    forms: list[str] = [name]
    dropped: list[str] = []
    while len(dropped) < MAX_DROPPED:
        last = forms[-1]
        if (m := _SUFFIX_RE.search(last)) is not None and m.start() > 0:
            dropped.append(last[m.start() :])
            forms.append(last[: m.start()])
        elif (m := _INFIX_RE.search(last)) is not None and m.start() > 0:
            dropped.append(m.group(0))
            forms.append(last[: m.start()] + last[m.end() :])
        else:
            break
    return forms, dropped


def _base(name: str) -> str:
    return _strip_variants(_norm(name))[0][-1]


def _keys(entry: CatalogName) -> set[str]:
    """The names of ``entry`` a logged name is compared with, variant suffixes kept."""
    hf_name = entry.hf_id.rsplit("/", 1)[-1]
    return {entry.model.lower(), _norm(hf_name)} - {""}


def _one(hits: set[str], logged: str, how: str, detail: str) -> NameMatch | None:
    """The match of one rule: one model, ambiguous (two or more), or None to try the next."""
    if not hits:
        return None
    if len(hits) > 1:
        return NameMatch(logged, None, "ambiguous", detail, tuple(sorted(hits)))
    return NameMatch(logged, next(iter(hits)), how, detail)


def _alias(logged: str, aliases: Mapping[str, str]) -> NameMatch | None:
    if logged in aliases:
        return NameMatch(logged, aliases[logged], "alias")
    folded = {k.lower(): v for k, v in aliases.items()}
    tail2 = "/".join(logged.split("/")[-2:])
    tail1 = logged.split("/")[-1]
    for form, detail in ((logged, ""), (tail2, "provider prefix"), (tail1, "path")):
        if form.lower() in folded:
            return NameMatch(logged, folded[form.lower()], "alias", f"{detail} read past" if detail else "case")
    return None


def resolve_model_name(
    logged: str,
    catalog: Iterable[CatalogName] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> NameMatch:
    """The catalog model ``logged`` names (see the module doc for the rules), with why.

    ``catalog`` defaults to the bundled catalog; ``aliases`` are the project's ``[models]`` table
    (``pipeline.ingest.project.find_project().models``), none when not given."""
    entries = tuple(catalog) if catalog is not None else catalog_names()
    table = aliases if aliases is not None else {}
    text = logged.strip()
    if not text or len(text) > MAX_NAME_CHARS:
        return NameMatch(logged, None, "none")
    found = _alias(text, table)
    if found is not None:
        return found
    parts = [p for p in text.split("/") if p]
    if not parts:
        return NameMatch(logged, None, "none")
    name = parts[-1]
    prefix = text[: len(text) - len(name)].rstrip("/")
    fireworks = _FIREWORKS_RE.search(text)
    said = f"{prefix + '/'!r} read past" if prefix else ""

    # 2. a catalog id as logged; 3. a whole Hugging Face id (organisation and name)
    ids = {e.model.lower(): e.model for e in entries}
    if text.lower() in ids:
        return NameMatch(logged, ids[text.lower()], "id")
    if len(parts) >= 2:
        full = "/".join(parts[-2:]).lower()
        hit = _one({e.model for e in entries if e.hf_id.lower() == full}, logged, "hf_id", _prefix_of(parts, 2))
        if hit is not None:
            return hit
    # the last path part: a catalog id, then the name part of a Hugging Face id
    if name.lower() in ids:
        return NameMatch(logged, ids[name.lower()], "id", said)
    hit = _one({e.model for e in entries if _norm(e.hf_id.rsplit("/", 1)[-1]) == name.lower()}, logged, "hf_id", said)
    if hit is not None:
        return hit
    # 4. variants: drop suffixes one at a time, then compare variant-free forms
    start, rewritten = name, []
    if fireworks and _fireworks(start) != start:
        start = _fireworks(start)
        rewritten.append("Fireworks' version spelling read")
    if start.lower().startswith("meta-llama-"):
        rewritten.append("'Meta-Llama-' read as 'Llama-'")
    forms, dropped = _strip_variants(start)
    for k, form in enumerate(forms):
        why = _why(said, rewritten, dropped[:k])
        hit = _one({e.model for e in entries if _norm(form) in _keys(e)}, logged, "variant", why)
        if hit is not None:
            return hit
    base = _norm(forms[-1])
    why = "; ".join(w for w in (_why(said, rewritten, dropped), "compared without variant suffixes") if w)
    hit = _one({e.model for e in entries if base in {_base(k) for k in _keys(e)}}, logged, "variant", why)
    if hit is not None:
        return hit
    return NameMatch(logged, None, "none")


def _prefix_of(parts: list[str], keep: int) -> str:
    rest = parts[:-keep]
    return f"{'/'.join(rest) + '/'!r} read past" if rest else ""


def _why(said: str, rewritten: list[str], dropped: list[str]) -> str:
    bits = [b for b in (said, *rewritten) if b]
    if dropped:
        bits.append("dropped " + ", ".join(repr(d) for d in dropped))
    return "; ".join(bits)


def resolve_model_names(
    names: Iterable[str],
    catalog: Iterable[CatalogName] | None = None,
    aliases: Mapping[str, str] | None = None,
) -> dict[str, NameMatch]:
    """:func:`resolve_model_name` for each distinct name (the catalog and aliases read once)."""
    entries = tuple(catalog) if catalog is not None else catalog_names()
    table = aliases if aliases is not None else {}
    return {n: resolve_model_name(n, entries, table) for n in dict.fromkeys(names)}


def canonical_model_names(names: Iterable[str], aliases: Mapping[str, str] | None = None) -> dict[str, str]:
    """Each distinct name's catalog id, or the name itself where it names none (or two): the key
    under which two spellings of one deployment are one model (one prefix-cache domain)."""
    return {n: (m.model if m.model is not None else n) for n, m in resolve_model_names(names, aliases=aliases).items()}
