"""How numbers and tables are written for people: bytes, numbers, counts and plain-text tables."""

from __future__ import annotations


def fmt_bytes(n: int | None, binary: bool = False) -> str:
    """Decimal units, three significant figures or so: 1.07 GB, 469 MB, 12 kB; `binary`: 1.04 GiB, 469.12 MiB
    (what llama.cpp's log and file managers show). None is "-"."""
    if n is None:
        return "-"
    if binary:
        for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
            if n >= scale:
                return f"{n / scale:.2f} {unit}"
        return f"{n} B"
    if n >= 1e10:
        return f"{n / 1e9:.1f} GB"
    if n >= 1e9:
        return f"{n / 1e9:.2f} GB"
    if n >= 1e6:
        return f"{n / 1e6:.0f} MB"
    return f"{n / 1e3:.0f} kB"


def fmt_num(x: float | None, spec: str = ".2f", suffix: str = "", none: str = "-") -> str:
    """`x` formatted with `spec` and `suffix`; None is `none`."""
    return none if x is None else f"{x:{spec}}{suffix}"


def fmt_count(n: int | None) -> str:
    """A count, short: 950, 12.3k, 4.56M. None is "-"."""
    if n is None:
        return "-"
    if n >= 1e6:
        return f"{n / 1e6:.2f}M"
    if n >= 1e4:
        return f"{n / 1e3:.1f}k"
    return f"{n:,}"


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """Columns padded to their widest cell, two spaces apart, the header first."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [header, *rows])
