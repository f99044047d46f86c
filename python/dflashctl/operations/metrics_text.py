"""Prometheus' text exposition format, read: what `dflashctl status` takes from an instance's and the
router's /metrics.

SGLang 0.5.11 (prometheus_client) and sglang-router 0.3.2 (the Rust `metrics` exporter) both write
version 0.0.4 of the format: `# HELP` / `# TYPE` comments, then one sample per line,
`name{label="value",...} value [timestamp]`, label values with `\\`, `\"` and `\n` escaped.
Only what status needs: samples by name, summed over a label selection.
"""

import math
from dataclasses import dataclass

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Sample:
    name: str
    labels: Labels
    value: float

    def label(self, key: str) -> str | None:
        return dict(self.labels).get(key)


class ParseError(ValueError):
    pass


def _labels(text: str, line: str) -> tuple[Labels, int]:
    """The label set starting after '{' at text[0]; returns (labels, index after '}')."""
    out, i = [], 1
    while True:
        while i < len(text) and text[i] in " ,":
            i += 1
        if i < len(text) and text[i] == "}":
            return tuple(out), i + 1
        eq = text.find("=", i)
        if eq < 0 or eq + 1 >= len(text) or text[eq + 1] != '"':
            raise ParseError(f"label without a quoted value in {line!r}")
        key, i, value = text[i:eq].strip(), eq + 2, []
        while i < len(text) and text[i] != '"':
            if text[i] == "\\" and i + 1 < len(text):
                value.append({"n": "\n", "\\": "\\", '"': '"'}.get(text[i + 1], text[i + 1]))
                i += 2
            else:
                value.append(text[i])
                i += 1
        if i >= len(text):
            raise ParseError(f"unterminated label value in {line!r}")
        out.append((key, "".join(value)))
        i += 1


def _number(text: str, line: str) -> float:
    try:
        return float({"+Inf": "inf", "-Inf": "-inf", "NaN": "nan"}.get(text, text))
    except ValueError:
        raise ParseError(f"not a number: {text!r} in {line!r}") from None


def parse(text: str) -> list[Sample]:
    samples = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        brace, space = line.find("{"), line.find(" ")
        if brace >= 0 and (space < 0 or brace < space):
            name = line[:brace]
            labels, end = _labels(line[brace:], line)
            rest = line[brace + end:].split()
        else:
            name, labels, rest = line.split()[0], (), line.split()[1:]
        if not rest:
            raise ParseError(f"sample without a value: {line!r}")
        samples.append(Sample(name, labels, _number(rest[0], line)))
    return samples


class Metrics:
    """One scrape, by metric name."""

    def __init__(self, samples: list[Sample]):
        self.by_name: dict[str, list[Sample]] = {}
        for s in samples:
            self.by_name.setdefault(s.name, []).append(s)

    @classmethod
    def from_text(cls, text: str) -> "Metrics":
        return cls(parse(text))

    def has(self, name: str) -> bool:
        return name in self.by_name

    def select(self, name: str, **match: str) -> list[Sample]:
        return [s for s in self.by_name.get(name, []) if all(s.label(k) == v for k, v in match.items())]

    def total(self, name: str, **match: str) -> float | None:
        """Sum over the matching samples; None when the metric is absent."""
        found = self.select(name, **match)
        return sum(s.value for s in found if not math.isnan(s.value)) if found else None

    def maximum(self, name: str, **match: str) -> float | None:
        found = [s.value for s in self.select(name, **match) if not math.isnan(s.value)]
        return max(found) if found else None
