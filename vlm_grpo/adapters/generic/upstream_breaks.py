"""Model types that a transformers release itself breaks, by version: the type is refused on those versions with
the reason (instead of a traceback from inside transformers), and the suite leaves it out there. Each entry is
checked by a test on the installed transformers: while the version matches, the model must still fail as said, so
an entry whose break was fixed upstream fails the suite until it is removed."""

from __future__ import annotations

from dataclasses import dataclass

from packaging.specifiers import SpecifierSet
from packaging.version import Version


@dataclass(frozen=True)
class UpstreamBreak:
    model_type: str
    transformers: str  # the versions broken, as a specifier (e.g. ">=5.24,<5.25")
    reason: str
    symptom: str  # text of the error a forward raises on those versions (what the check test looks for)


BREAKS = (
    UpstreamBreak("llama4", ">=5.24,<5.25", "transformers 5.24's Llama4ForConditionalGeneration.forward reads "
                  "`image_outputs` off the language model's output, which has no such field: every forward fails "
                  "(5.23 works)", symptom="image_outputs"),
)


def upstream_break(model_type: str, version: str) -> UpstreamBreak | None:
    for entry in BREAKS:
        if entry.model_type == model_type and Version(version) in SpecifierSet(entry.transformers):
            return entry
    return None
