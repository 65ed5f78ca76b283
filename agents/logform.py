"""Kernel-log presentations: find the kernel's own message in a line, whatever wraps it.

One kernel message reaches an agent, or a saved file, in many presentations. Each line is
looked at on its own (files mix forms: a syslog file holding pasted ``dmesg`` output) and its
known prefixes are peeled off, outermost first, until the message is left:

* a ``/dev/kmsg`` record, ``PRIO,SEQ,USEC,FLAGS[,...];MESSAGE``, whose non-printable bytes
  are escaped as ``\\xNN`` (a message of several lines is one record with ``\\x0a``); its
  dictionary lines (`` SUBSYSTEM=pci``) carry no message;
* ``dmesg``: ``[ 12.345678]`` (default), ``<4>`` (``-r``), ``kern  :warn  :`` (``-x``),
  ``[Tue Dec  1 07:49:49 2026]`` (``-T``), ``2026-12-01T07:49:49,123456+00:00``
  (``--time-format iso``), ``[  +0.000123]`` and ``[ 12.3 <  0.1>]`` (``--time-format
  reltime``, ``-d``), or no stamp at all (``-t``);
* syslog and ``journalctl`` text: a time stamp (``Dec  1 07:49:49``, ``Dec 01
  07:49:49.123456``, ISO 8601, ``Tue 2026-12-01 07:49:49 UTC``, Unix seconds, ``[ 12.3]``),
  an optional host, then the ``kernel:`` tag, optionally followed by ``[ 12.345678]``;
  RFC 5424 (``<4>1 TIMESTAMP HOST kernel - - - MESSAGE``); a container runtime's log prefix
  (``TIMESTAMP stdout F``);
* ``journalctl -o json`` / ``json-seq`` objects and ``-o export`` / ``-o verbose`` fields
  (``MESSAGE=``), read as journal entries: only the kernel transport counts, and a MESSAGE
  that is not valid UTF-8 comes as an array of bytes;
* any other prefix (layer ``prefix``), when the driver's message starts after it at a word's
  start and every word before it reads as a stamp or a label: a word with a digit (a time
  stamp in a form no layer names, ``2026/12/01``, a host like ``gpu-n3``, a task number), a
  bracketed or angled field, punctuation (``|``, ``-``), a month, a weekday, a time zone, a
  log level or facility (``kern.warn``), ``kernel:``. The first word of a line may also be a
  host label with a digit (``gpu-n3:``, as pdsh and clush print), and a host name may come
  right before ``kernel:``. A quote, a parenthesis, a word of prose or a program's tag
  (``myapp:``, ``python3[4242]:``) before the message says it is quoted, and the line gives
  nothing.

A line whose presentation proves it came from the kernel (a kmsg record, a dmesg stamp, the
``kernel:`` tag, the journal's kernel transport) or whose message starts with a driver's own
prefix (``NVRM:``, ``nvidia-nvswitchN:``) is a kernel line. Anything else (a program's own
syslog line, a traceback quoting a kernel line) is not, whatever text it contains.

Pure functions; nothing here raises on odd input.
"""

from __future__ import annotations

import json
import re
import struct
from collections.abc import Iterator, Mapping
from itertools import islice
from typing import Any, NamedTuple

#: Where a driver's own message starts: what a kernel message we care about begins with.
ANCHORS = ("NVRM:", "nvidia-nvswitch")
#: Syslog tags that are the driver's own prefix: a line written to /dev/kmsg by a program
#: (not by the kernel) is stored by journald with its prefix taken as the program's name.
_DRIVER_TAG = r"NVRM|nvidia-nvswitch\d*"

_KMSG_RECORD = re.compile(
    r"^(?P<prio>\d{1,4}),(?P<seq>\d{1,20}),(?P<ts>\d{1,20}),(?P<flags>[^;,]*)(?:,[^;]*)?;"
    r"(?P<msg>.*)$",
    re.S,
)
_KMSG_DICT = re.compile(r"^ [A-Z0-9_]+=")
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")

# Syslog-style time stamps that may open a line before the host (not anchored on purpose:
# they are used inside _SYSLOG).
_TS = (
    r"(?:[A-Z][a-z]{2} +\d{1,2} \d\d:\d\d:\d\d(?:\.\d+)?"  # Dec  1 07:49:49(.123456)
    r"|[A-Z][a-z]{2} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)? [A-Z]{2,5}"  # short-full
    r"|\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?"  # ISO 8601
    r"|\d{9,11}\.\d+)"  # short-unix
)
#: (name, pattern) of each prefix layer; the first that matches the text's start is peeled.
#: (:data:`_FIRST` says which characters each may start with, so most are never tried.)
_LAYERS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("container", re.compile(r"^\d{4}-\d\d-\d\dT\S+ (?:stdout|stderr) [FP] ")),
    ("<prio>", re.compile(r"^<(?P<prio>\d{1,4})>")),
    (
        "facility:level",
        re.compile(
            r"^(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|res\d+"
            r"|local[0-7])\s*:\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*: ?"
        ),
    ),
    ("[seconds]", re.compile(r"^\[\s*(?P<ts>\d+\.\d+)(?:\s*<\s*[\d.]+>)?\]\s?")),
    ("[time]", re.compile(r"^\[[^\]\[]{0,40}\d[^\]\[]{0,40}\]\s?")),
    (
        "iso-time",
        re.compile(r"^\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\s"),
    ),
    (
        "rfc5424",
        re.compile(
            rf"^\d (?:\S+) (?:\S+) (?P<tag>kernel|{_DRIVER_TAG}) \S+ \S+ (?:-|(?:\[[^\]]*\])+) ?"
            "\ufeff?"
        ),
    ),
    (
        "syslog",
        re.compile(
            rf"^(?:{_TS}\s+)?(?:[A-Za-z0-9][\w.\-]*\s+)?(?P<tag>kernel|{_DRIVER_TAG})"
            r"(?:\[\d+\])?: ?"
        ),
    ),
)
_MAX_LAYERS = 8
#: One word of a prefix no layer names: a bracketed or angled field, or a run of non-spaces.
_WORD = re.compile(r"\[[^\[\]]*\]\s*|<[^<>]*>\s*|\S+\s*")
#: How many words an unnamed prefix may have before the driver's message.
_MAX_PREFIX_WORDS = 16
#: A program's syslog tag (``myapp:``, ``python3[4242]:``): a quoting program's line.
_PROGRAM_TAG = re.compile(r"^[A-Za-z_][\w.\-/]*(?:\[[0-9]+\])?:$")
_HOST = re.compile(r"^[A-Za-z0-9][\w.\-]*$")
_QUOTING = re.compile(r"[\"'`(){}]")
_DIGIT = re.compile(r"[0-9]")
_ALNUM = re.compile(r"[^\W_]")
#: Words of time stamps and log levels that may stand in a prefix.
_STAMP_WORDS = frozenset(
    {
        *("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"),
        *("mon", "tue", "wed", "thu", "fri", "sat", "sun", "am", "pm"),
        *("kern", "user", "daemon", "syslog", "kernel", "stdout", "stderr"),
        *("emerg", "alert", "crit", "err", "error", "warn", "warning", "notice", "info", "debug"),
    }
)
_DIGITS = frozenset("0123456789")
_FIRST: dict[str, frozenset[str] | None] = {
    "container": _DIGITS,
    "<prio>": frozenset("<"),
    "facility:level": frozenset("kumdaslncfr"),
    "[seconds]": frozenset("["),
    "[time]": frozenset("["),
    "iso-time": _DIGITS,
    "rfc5424": _DIGITS,
    "syslog": None,  # a month, a weekday, a year, a host or the tag itself
}


class Record(NamedTuple):
    """One kernel-log message as a presentation carried it.

    ``text`` is the message (several lines joined by ``\\n`` when the record holds them);
    ``kernel`` tells whether it is a kernel line (see the module docstring); ``form`` names
    the layers peeled (``"syslog+[seconds]"``, ``"kmsg"``, ``"journal-json"``, ``"plain"``);
    ``seq`` is the /dev/kmsg sequence number, ``kernel_ts`` the kernel's time stamp in
    seconds since boot, ``boot_id``/``cursor`` the journal's, when the presentation has them.
    """

    text: str
    kernel: bool
    form: str = "plain"
    seq: int | None = None
    kernel_ts: float | None = None
    boot_id: str | None = None
    cursor: str | None = None
    raw: str = ""


def anchored(text: str) -> bool:
    """True when ``text`` starts with a driver's own prefix (``NVRM:``, ``nvidia-nvswitch``)."""
    return text.startswith(ANCHORS)


def unescape_kmsg(text: str) -> str:
    """A /dev/kmsg message with its ``\\xNN`` escapes undone (bytes decoded as UTF-8)."""
    if "\\x" not in text:
        return text
    out, at = bytearray(), 0
    for m in _ESCAPE.finditer(text):
        out += text[at : m.start()].encode()
        out.append(int(m[1], 16))
        at = m.end()
    out += text[at:].encode()
    return out.decode("utf-8", errors="replace")


def is_kmsg_dict_line(line: str) -> bool:
    """A /dev/kmsg dictionary line (`` SUBSYSTEM=pci``, `` DEVICE=+pci:0000:3b:00.0``)."""
    return bool(_KMSG_DICT.match(line)) and line.split("=", 1)[0].strip() in (
        "SUBSYSTEM",
        "DEVICE",
    )


def read_line(line: str) -> Record:
    """The record one text line carries (never None: an unknown line is a ``plain`` one,
    a kernel line only when its message starts with a driver's prefix)."""
    m = _KMSG_RECORD.match(line)
    if m:
        text = unescape_kmsg(m["msg"])
        return Record(text, True, "kmsg", int(m["seq"]), int(m["ts"]) / 1e6, raw=line)
    names: list[str] = []
    text, kernel, ts = line, False, None
    for _ in range(_MAX_LAYERS):
        if text.startswith(ANCHORS):
            break
        peeled = _peel(text) or _peel_unnamed(text, first=not names)
        if peeled is None:
            break
        name, text, stamp, proof = peeled
        names.append(name)
        ts = stamp if ts is None else ts
        kernel = kernel or proof
    form = "+".join(names) or "plain"
    return Record(text, kernel or text.startswith(ANCHORS), form, None, ts, raw=line)


#: Layers whose presence proves a kernel line by itself.
_PROOF = frozenset({"<prio>", "facility:level", "[seconds]"})


def _peel(text: str) -> tuple[str, str, float | None, bool] | None:
    """``(layer, the rest, kernel time stamp, proves a kernel line)`` for the outermost
    prefix layer of ``text``, or None when it starts with none."""
    first = text[:1]
    for name, pattern in _LAYERS:
        starts = _FIRST[name]
        if starts is not None and first not in starts:
            continue
        lm = pattern.match(text)
        if lm is None or lm.end() == 0:
            continue
        rest = text[lm.end() :]
        if name == "[seconds]":
            return name, rest, float(lm["ts"]), True
        if name in ("syslog", "rfc5424"):
            tag = lm["tag"]
            if tag != "kernel":
                rest = f"{tag}: {rest}"  # the driver's prefix, taken for a program's name
            return name, rest, None, True
        return name, rest, None, name in _PROOF
    return None


def _peel_unnamed(text: str, first: bool) -> tuple[str, str, float | None, bool] | None:
    """``("prefix", the rest, None, False)`` when the driver's message starts later in
    ``text``, after words that all read as stamps or labels (module docstring), or None. The
    rest starts at the first named layer or the message itself, so a named layer inside the
    prefix (``[ 12.3]``) still gives its time stamp. ``first``: ``text`` starts the line."""
    at = min((i for i in (text.find(a) for a in ANCHORS) if i > 0), default=-1)
    if at < 0 or not (text[at - 1].isspace() or text[at - 1] in "]>|"):
        return None  # no message, or one that does not start a word
    prefix = text[:at]
    if _QUOTING.search(prefix):
        return None  # quoted or parenthesised text: the message is being cited
    words = [w.group().strip() for w in islice(_WORD.finditer(prefix), _MAX_PREFIX_WORDS + 1)]
    if not words or len(words) > _MAX_PREFIX_WORDS:
        return None
    for i, word in enumerate(words):
        after = words[i + 1] if i + 1 < len(words) else ""
        if not _stamp_word(word, first and i == 0, after):
            return None
    for m in islice(_WORD.finditer(prefix), 1, None):
        if _peel(text[m.start() :]) is not None:
            return "prefix", text[m.start() :], None, False
    return "prefix", text[at:], None, False


def _stamp_word(word: str, first: bool, after: str) -> bool:
    """True when one word before a driver's message reads as part of a stamp or a label."""
    if word[:1] in "[<" or word in ("kernel", "kernel:"):
        return True
    if _PROGRAM_TAG.match(word):
        return first and "[" not in word and _DIGIT.search(word) is not None  # pdsh: host
    if _DIGIT.search(word) or not _ALNUM.search(word):
        return True  # a stamp, a number, a host with a digit; punctuation
    if all(part in _STAMP_WORDS for part in word.lower().rstrip(",;").split(".")):
        return True
    if word.isupper() and word.isalpha() and 2 <= len(word) <= 5:
        return True  # a time zone (UTC, CEST)
    return after in ("kernel", "kernel:") and bool(_HOST.match(word))  # the host before it


def from_entry(entry: Mapping[str, Any], form: str) -> Record | None:
    """The record a journal entry (a ``-o json`` object or an ``-o export`` entry) carries,
    or None when it is not a kernel message (another transport, another program's line) or
    has no MESSAGE. A MESSAGE given as an array of bytes is decoded as UTF-8."""
    message = entry.get("MESSAGE")
    if isinstance(message, list):
        if not all(isinstance(b, int) and 0 <= b <= 255 for b in message):
            return None
        message = bytes(message).decode("utf-8", errors="replace")
    if not isinstance(message, str):
        return None
    transport = entry.get("_TRANSPORT")
    ident = entry.get("SYSLOG_IDENTIFIER")
    if transport is not None and transport != "kernel":
        return None
    if isinstance(ident, str) and ident != "kernel":
        # journald takes "NAME: " off a line a program wrote to /dev/kmsg; put it back
        if transport != "kernel" and not re.fullmatch(_DRIVER_TAG, ident):
            return None
        message = f"{ident}: {message}"
    ts = _int(entry.get("_SOURCE_MONOTONIC_TIMESTAMP"))
    boot = entry.get("_BOOT_ID")
    cursor = entry.get("__CURSOR")
    return Record(
        message,
        True,
        form,
        None,
        ts / 1e6 if ts is not None else None,
        boot if isinstance(boot, str) else None,
        cursor if isinstance(cursor, str) else None,
        raw=json.dumps(dict(entry), sort_keys=True, default=str)[:4096],
    )


def _int(value: object) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return None


def json_entry(line: str) -> dict[str, Any] | None:
    """The journal entry of one ``-o json`` (or ``json-seq``, with its leading RS) line, or
    None when the line is not a JSON object."""
    text = line.lstrip("\x1e").strip()
    if not text.startswith("{"):
        return None
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def iter_json_entries(text: str) -> Iterator[dict[str, Any]]:
    """Every JSON object in ``text`` (``-o json``, ``json-seq`` or ``json-pretty``, several
    per file), in order; stops at the first thing that is not JSON."""
    decoder = json.JSONDecoder()
    at = 0
    while True:
        while at < len(text) and (text[at].isspace() or text[at] == "\x1e"):
            at += 1
        if at >= len(text):
            return
        try:
            value, at = decoder.raw_decode(text, at)
        except ValueError:
            return
        if isinstance(value, dict):
            yield value
        elif isinstance(value, list):  # a file holding one array of entries
            yield from (v for v in value if isinstance(v, dict))


def looks_like_export(data: bytes) -> bool:
    """True when ``data`` is ``journalctl -o export`` output (it opens with ``__CURSOR=``)."""
    return data.lstrip(b"\n").startswith(b"__CURSOR=")


def iter_export_entries(data: bytes) -> Iterator[dict[str, str]]:
    """The entries of ``journalctl -o export`` output, fields as text.

    A field is ``KEY=value`` on one line, or, when its value is binary (a newline, bytes that
    are not UTF-8), ``KEY``, a newline, the value's length as 64-bit little-endian, the value
    and a newline. Entries end at an empty line. A truncated binary field ends the input.
    """
    entry: dict[str, str] = {}
    at = 0
    while at < len(data):
        end = data.find(b"\n", at)
        if end < 0:
            end = len(data)
        line = data[at:end]
        at = end + 1
        if not line:
            if entry:
                yield entry
            entry = {}
            continue
        key, sep, value = line.partition(b"=")
        if sep:
            entry[key.decode(errors="replace")] = value.decode(errors="replace")
            continue
        if at + 8 > len(data):
            break
        (size,) = struct.unpack("<Q", data[at : at + 8])
        value = data[at + 8 : at + 8 + size]
        if len(value) < size:
            break
        entry[key.decode(errors="replace")] = value.decode(errors="replace")
        at += 8 + size + 1
    if entry:
        yield entry
