"""How counts read in the messages people see: "1 partition", "3 partitions"."""


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` and ``noun``, the noun in the plural unless ``n`` is 1 (``plural``, else
    noun + "s"); ``n`` as digits alone, as the summaries always wrote it (scripts read them)."""
    return f"{n} {noun if n == 1 else (plural or noun + 's')}"
