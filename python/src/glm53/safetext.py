"""Text that came from outside (a file, a server, a path, argv), made safe to show and to check.

    printable(text)       control, bidi and other invisible format characters as visible escapes (\\x1b,
                          \\u202e); newlines and tabs kept. Every console glm53 prints through applies it
                          (glm53.output.SafeConsole), so no file or server can move the cursor, retitle the
                          terminal or reorder what a person reads.
    mask_secrets(text)    `scheme://user:SECRET@host` as `scheme://user:***@host`, wherever it appears.
    hostname_problem(h)   why `h` is not a host name or address (spaces, control or bidi characters, ...), or None.

Imports nothing of glm53: it sits at the bottom, with glm53.errors.
"""

from __future__ import annotations

import ipaddress
import re
import unicodedata

# Kept as they are: they shape multi-line messages and tables, and move nothing but the line.
_KEPT = frozenset("\n\t")
# user:password@ inside a URL, for any scheme; the user part is kept (it names the account, not the key).
# The secret may hold anything but the separators: masking too much is harmless, too little is not.
_URL_SECRET = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):(?P<secret>[^/@\n]*)@")
_LABEL = re.compile(r"^[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?$")


def _escape(char: str) -> str:
    code = ord(char)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def _unsafe(char: str) -> bool:
    if char in _KEPT:
        return False
    # Cc: C0 and C1 controls (ESC, CSI, BEL, CR, DEL); Cf: bidi overrides and isolates, zero-width characters;
    # Zl/Zp: line and paragraph separators; Cs/Co/Cn: surrogates (undecodable bytes), private use, unassigned.
    return unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp", "Cs")


def printable(text: str) -> str:
    """`text` with every character that would act on a terminal instead of showing, as a visible escape."""
    if text.isprintable():  # the common case, and fast: isprintable() is False for every character escaped here
        return text
    return "".join(_escape(char) if _unsafe(char) else char for char in text)


def mask_secrets(text: str) -> str:
    """Every `scheme://user:secret@` in `text` with the secret replaced by ***."""
    if "://" not in text:
        return text
    return _URL_SECRET.sub(lambda m: f"{m['head']}:***@", text)


def shown(text: str) -> str:
    """What an error message may quote of a value from outside: secrets masked, characters made visible."""
    return printable(mask_secrets(text))


def quoted(text: str, *, limit: int = 200) -> str:
    """`text` in quotes for a message: shown (masked, escaped) once, not escaped again as repr() would, and
    cut in the middle past `limit` characters."""
    visible = shown(text)
    if len(visible) > limit:
        visible = visible[: limit // 2] + "..." + visible[-(limit // 2 - 3) :]
    return f"'{visible}'"


def hostname_problem(host: str) -> str | None:
    """Why `host` is not a DNS name, an IPv4 address or an IPv6 address (bracketed or not), or None if it is."""
    if not host:
        return "is empty"
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ipaddress.ip_address(bare.split("%", 1)[0] if ":" in bare else bare)
        return None
    except ValueError:
        pass
    if bare != host or ":" in bare:
        return "is not an IPv6 address"
    if any(char.isspace() for char in bare):
        return "holds white space"
    if not bare.isascii() or not bare.isprintable():
        return "holds control, bidi or non-ASCII characters (write an internationalised name in its xn-- form)"
    if len(bare) > 253:
        return "is longer than the 253 characters a host name may be"
    labels = bare[:-1].split(".") if bare.endswith(".") else bare.split(".")
    if not all(_LABEL.fullmatch(label) for label in labels):
        return "is not a host name (letters, digits and hyphens, dot-separated labels of 1 to 63 characters)"
    return None


__all__ = ["hostname_problem", "mask_secrets", "printable", "quoted", "shown"]
