"""Human-readable figures for what the CLI prints."""

from __future__ import annotations


def size(nbytes: float | None) -> str:
    """Bytes in the largest binary unit that keeps the figure at least 1 (GiB at most)."""
    if nbytes is None:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(nbytes) >= scale:
            return f"{nbytes / scale:.2f} {unit}"
    return f"{int(nbytes)} B"


def count(n: float | None) -> str:
    """A large count with a decimal suffix: 1.604 B, 33.09 K."""
    if n is None:
        return "-"
    for suffix, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3f} {suffix}" if suffix == "B" else f"{n / scale:.2f} {suffix}"
    return str(int(n))


def many(n: int, noun: str) -> str:
    """`n` and the noun in the number it takes: 1 probe, 2 probes."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def flops(n: float | None) -> str:
    if n is None:
        return "-"
    for suffix, scale in (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {suffix}"
    return f"{n:.0f} FLOP"


def resolution_words(resolution: int, unit: str) -> str:
    """A resolution in its model's unit: `4096 tokens` for a language model, `1024px` else."""
    return f"{resolution} tokens" if unit == "tokens" else f"{resolution}px"


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    return f"{s:.3f} s" if s >= 1 else f"{s * 1e3:.2f} ms"


def value(v: object) -> str:
    """A config value as the command line writes it (true/false, not True/False)."""
    return str(v).lower() if isinstance(v, bool) else str(v)


def parsed_value(text: str) -> bool | int | str:
    """A knob value written as text (by `value`, a CSV or a command line) typed back as Hydra
    types it: booleans and integers, else the string."""
    if text in ("True", "False", "true", "false"):
        return text.lower() == "true"
    try:
        return int(text)
    except ValueError:
        return text
