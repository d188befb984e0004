"""One figure of `make bench` and the table they make: the measured value beside its reference
(the peer or the floor it is measured against) and their ratio, then the target."""

from dataclasses import dataclass


@dataclass
class Figure:
    name: str
    measured: str
    target: str
    ok: bool
    reference: str = ""  # what the measured value is compared with: a peer, a floor or an ideal
    ratio: float | None = None  # measured / reference, where that is the figure the target is about

    def line(self) -> str:
        against = f" vs {self.reference}" if self.reference else ""
        ratio = f" = {self.ratio:.2f}" if self.ratio is not None else ""
        return (
            f"  {'PASS' if self.ok else 'MISS'}  {self.name}: {self.measured}{against}{ratio}   (target: {self.target})"
        )


def table(figures: list[Figure]) -> str:
    lines = ["| figure | measured | reference | ratio | target | met |", "|---|---|---|---|---|---|"]
    for f in figures:
        ratio = f"{f.ratio:.2f}" if f.ratio is not None else ""
        lines.append(f"| {f.name} | {f.measured} | {f.reference} | {ratio} | {f.target} | {'yes' if f.ok else 'no'} |")
    return "\n".join(lines)
