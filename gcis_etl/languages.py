"""Language tags as IIIF 3.0 keys its values by: one rule for what the configuration names (manifests'
default_language, OTMM's metadata_language) and for what sources and embedded metadata give."""
from __future__ import annotations

import re

# IIIF 3.0's `none`, or BCP 47's shape: a 2- or 3-letter language (every registered one is), then subtags; letters
# only, as IIIF 3.0 (iiif-prezi3, the schema) accepts a key
LANGUAGE = re.compile(r"^(none|[a-zA-Z]{2,3}(-[a-zA-Z]{1,8})*)$")
# BCP 47 also has subtags with digits (es-419, de-CH-1996), which IIIF 3.0 does not accept in a key
_WITH_DIGITS = re.compile(r"^[a-zA-Z]{2,3}(-[a-zA-Z0-9]{1,8})*$")


class DigitSubtag(ValueError):
    """A BCP 47 tag that IIIF 3.0 does not accept as a key for its subtags with digits: `nearest` is the tag up to
    the first of them (es-419: es), which keeps at least the language."""

    def __init__(self, language: str, nearest: str):
        super().__init__(f"{language!r} has a subtag with digits, which IIIF 3.0 does not accept in a language key "
                         f"(the nearest it accepts: {nearest!r})")
        self.nearest = nearest


def language_tag(language: str | None) -> str | None:
    """`language` as a IIIF language key (`none` included): a POSIX locale (en_US.UTF-8, de_DE@euro) as BCP 47
    (en-US). None for no language: none given, empty, or XMP's x-default. DigitSubtag for a tag IIIF 3.0 does
    not accept only for its digits (es-419); ValueError for what is still no tag (`en US`, `*`, `english`)."""
    tag = re.split(r"[.@]", language or "", maxsplit=1)[0].strip().replace("_", "-")
    if tag.lower() in ("", "x-default"):
        return None
    if _WITH_DIGITS.match(tag) and not LANGUAGE.match(tag):
        raise DigitSubtag(language, re.match(r"[a-zA-Z]+(-[a-zA-Z]+)*(?=-|$)", tag)[0])
    if not LANGUAGE.match(tag):
        raise ValueError(f"{language!r} is not a language tag such as en or en-US")
    return tag
